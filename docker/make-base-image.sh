#!/usr/bin/env bash
# Make the local base image of the `cpu` cell. No image registry is reachable from CI, so the image
# is bootstrapped from the Debian mirror apt already uses and imported into the local engine.
# ca-certificates is included because a debootstrap rootfs has no CA store at all, and the Dockerfiles
# layer the host's CA bundle over it for pip's TLS. Skips when the image exists.
#
#   sudo docker/make-base-image.sh [IMAGE]   env: DEBIAN_MIRROR overrides the mirror taken from apt
set -euo pipefail

IMAGE=${1:-gdn-matrix/bookworm-python:local}
SUITE=bookworm

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "base image $IMAGE exists"
  exit 0
fi

# The first Debian archive URI of apt's sources (deb822 .sources or one-line .list files); the
# security archive is left out since debootstrap needs the main one.
apt_mirror() {
  grep -hsE '^[[:space:]]*(URIs:|deb[[:space:]])' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list.d/*.sources |
    tr -s ' \t' '\n' | grep -E '^(https?|file)://' | grep -E '/debian/?$' | head -n 1 || true
}

MIRROR=${DEBIAN_MIRROR:-$(apt_mirror)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROOTFS=$WORK/rootfs

echo "bootstrapping $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 || {
  tail -n 30 "$WORK/debootstrap.log" >&2
  exit 1
}
# Package caches only bloat the image; every layer above installs with pip.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

tar -C "$ROOTFS" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' \
  - "$IMAGE"
echo "base image $IMAGE imported"
