//go:build !amd64

package oci

// pauseProgram is the init of a container whose action is a tree; there is none for this
// architecture yet, so such containers are refused (see pause_amd64.go).
var pauseProgram []byte
