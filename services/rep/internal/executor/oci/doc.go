// Package oci is the executor backend that runs every container as an OCI container through
// containerd and runc (docs/decisions/0019-oci-backend-containerd.md). It is registered as
// "oci".
//
// A container is, on the cell:
//   - a directory under Options.WorkDir holding an overlay mount of the resolved rootfs (the
//     read-only lower directory, e.g. a preloaded rootfs) with a writable upper and work
//     directory, mounted before the container is created and unmounted when it is done;
//   - a containerd container in the namespace Config.Namespace whose OCI spec (BuildSpec) has
//     the overlay mount point as its root, no image and no snapshot;
//   - a task (the run action as its init process, or a tree's init program) in new pid,
//     mount, uts, ipc and network namespaces, with memory, pids and CPU shares limits in a
//     cgroup under /gavel and RLIMIT_NOFILE, as the run action's user (non-root by default);
//   - with a docker:// image, an active snapshot on the image's layers in containerd's store,
//     whose image is removed once no container has used it for Config.ImageUnusedFor
//     (imagegc.go), pulled with the work's registry credentials (image.go).
//
// The work's properties are the spec's annotations, keys and values byte for byte, with no
// prefix. Without a Network the container has a network namespace with only loopback, its
// checks are probed from inside that namespace, and its ports are not reachable from outside.
//
// Containers outlive the rep. Each one's record (record.go) is written in its directory before
// its containerd container is created, and a restarted rep's Backend.Adopt takes over the
// namespace's recorded containers and removes everything else an earlier run left
// (docs/decisions/0030-oci-adoption.md). A wait broken by a containerd restart is made again.
//
// The container's action is a run action (its init process), or a serial action of download
// actions ending with one; a setup action may hold download actions (one, or a serial of
// them). The rep runs the downloads into the container's root filesystem before its process
// starts (download.go; docs/decisions/0041-oci-downloads.md). Every other action tree (IsTree:
// parallel, codependent, try, timeout, a run action before the last, a monitor action) runs
// with a minimal init program as the container's init (pause_amd64.go) and each run action
// exec'd in the container, interpreted by package actions as on the process backend (tree.go;
// docs/decisions/0045-oci-action-trees.md). A tree container is not adopted by a later rep.
package oci
