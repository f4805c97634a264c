#!/usr/bin/env bash
# Build deltad's OCI image with podman, without a registry: a Debian bookworm base made by
# mmdebstrap from Debian's packages, the project's wheels built on this host (Python 3.11, the
# base's), then deploy/image/Containerfile's last stage. CI runs it; docs/daemon.md, "Image".
#
#   deploy/image/build.sh [--tag NAME:TAG]      default localhost/deltad:<pyproject version>
#
# Needs root, podman, mmdebstrap and Python 3.11 (`apt-get install podman runc mmdebstrap`).
# The base is cached as a podman image named by a hash of what goes into it, so a rebuild only
# rebuilds the wheels and the last layer. Podman runs with runc, cgroupfs and no default ulimits
# (deploy/image/containers.conf), which also work inside an unprivileged container.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -1)"
tag="localhost/deltad:$version"
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    *) echo "usage: $0 [--tag NAME:TAG]" >&2; exit 2 ;;
  esac
done
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
python="${PYTHON:-python3}"  # one with pip (CI passes the venv's)
pyver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$pyver" != 3.11 ]; then
  echo "build.sh: $python is Python $pyver; the wheels must be built by 3.11 (bookworm's)" >&2
  exit 2
fi

# The base: Debian's python3 (3.11), venv, CA certificates and tini; nothing else.
packages="python3,python3-venv,ca-certificates,tini"
suite=bookworm
base_id="$(printf '%s %s minbase 1' "$suite" "$packages" | sha256sum | cut -c1-12)"
base="localhost/deltad-base:$suite-$base_id"
if ! podman image exists "$base"; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$suite" "$work/rootfs.tar"
  podman import --quiet --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$base" >/dev/null
  rm -rf "$work"
  trap - EXIT
fi

# The wheels, for the Containerfile's `wheels` stage, which this replaces: the dependencies (the
# kubernetes extra included) kept per pyproject.toml, so that their layer is reused, and
# deltad's own, built each time.
cache="${XDG_CACHE_HOME:-$HOME/.cache}/deltad-image"
deps_id="$(cat "$repo/pyproject.toml" - <<<"$pyver" | sha256sum | cut -c1-12)"
deps="$cache/deps-$deps_id"
if [ ! -d "$deps" ]; then
  rm -rf "$deps.tmp"
  "$python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$deps.tmp" \
    "$repo[kubernetes]"
  rm -f "$deps.tmp"/deltad-*.whl
  mv "$deps.tmp" "$deps"
fi
rm -rf "$cache/context"
mkdir -p "$cache/context/wheels/app"
cp -a "$deps" "$cache/context/wheels/deps"
"$python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
  --wheel-dir "$cache/context/wheels/app" "$repo"

previous="$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)"
podman build --quiet --isolation=chroot --build-arg "BASE=$base" \
  --build-context "wheels=$cache/context" --file "$here/Containerfile" \
  --label "org.opencontainers.image.version=$version" \
  --tag "$tag" "$cache/context" >/dev/null
# The image this tag named before, now nameless: removed unless a container still uses it.
current="$(podman image inspect --format '{{.Id}}' "$tag")"
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
echo "$tag"
