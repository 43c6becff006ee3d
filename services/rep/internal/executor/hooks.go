package executor

// HookRunner is a Backend that runs the cell's container hooks itself (oci: as OCI
// createRuntime and poststop hooks in the container's spec, which receive the OCI state on
// stdin); the cell then does not run them around its containers.
type HookRunner interface {
	// RunsHooks reports whether the backend runs the hooks it was given (OCIOptions).
	RunsHooks() bool
}
