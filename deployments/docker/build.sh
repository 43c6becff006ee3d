#!/usr/bin/env bash
# Builds Gavel's FROM-scratch image from the project's static binaries and, when the host has
# Debian's prometheus, the compose deployment's Prometheus image (prometheus.Dockerfile).
#   deployments/docker/build.sh [tag] [prometheus-tag]   (default gavel:dev gavel-prometheus:dev)
set -euo pipefail
tag=${1:-gavel:dev}
ptag=${2:-gavel-prometheus:dev}
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

# Prometheus: the host's binary with the libraries ldd names (glibc's loader and libc).
if prom=$(command -v prometheus); then
	pctx=$(mktemp -d)
	trap 'rm -rf "$ctx" "$pctx"' EXIT
	mkdir -p "$pctx/fs/bin" "$pctx/fs/prometheus" "$pctx/fs/tmp"
	chmod 1777 "$pctx/fs/prometheus" "$pctx/fs/tmp"
	cp "$prom" "$pctx/fs/bin/prometheus"
	for lib in $(ldd "$prom" | grep -o '/[^ ]*'); do
		mkdir -p "$pctx/fs$(dirname "$lib")"
		cp -L "$lib" "$pctx/fs$lib"
	done
	docker build -q -f "$here/prometheus.Dockerfile" -t "$ptag" "$pctx"
else
	echo "build.sh: no prometheus on PATH: $ptag not built (compose.yaml's prometheus service needs it, or GAVEL_PROMETHEUS_IMAGE)" >&2
fi
