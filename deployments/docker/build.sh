#!/usr/bin/env bash
# Builds Gavel's FROM-scratch image from the project's static binaries.
#   deployments/docker/build.sh [tag]     (default gavel:dev)
set -euo pipefail
tag=${1:-gavel:dev}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/fs/tmp" "$ctx/fs/var/lib/etcd" "$ctx/fs/var/gavel/rep" "$ctx/fs/var/gavel/rootfs/cflinuxfs4"
chmod 1777 "$ctx/fs/tmp"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -o "$ctx/bin/" \
	./services/bbs/cmd/bbs ./services/auctioneer/cmd/auctioneer ./services/rep/cmd/rep \
	./services/routeemitter/cmd/routeemitter ./services/router/cmd/router ./services/nsync/cmd/nsync \
	./cmd/gavel ./cmd/gavel-etcd ./examples/hello)
docker build -q -f "$here/Dockerfile" -t "$tag" "$ctx"
