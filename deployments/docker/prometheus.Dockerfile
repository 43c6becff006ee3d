# Prometheus for the compose deployment, without pulling anything: the host's Debian
# prometheus binary (dynamically linked to glibc only) with its loader and libc, on scratch.
# Built by deployments/docker/build.sh (`make image`) when prometheus is installed; the
# context it stages:
#   bin/prometheus, lib/x86_64-linux-gnu/libc.so.6, lib64/ld-linux-x86-64.so.2 (from ldd)
#   prometheus/   the data directory
# It runs as root, like the gavel image: the certificates mounted at /pki are readable by their
# owner only.
FROM scratch
COPY fs/ /
ENTRYPOINT ["/bin/prometheus"]
