#!/usr/bin/env bash
# Builds a ringlane image (`make image-cpu`, `make image-cuda`): a Debian bookworm base
# filesystem from debootstrap (minbase plus exactly the shared libraries the
# three daemons link, found with ldd and dpkg -S; no compiler, no build
# tools), the stripped daemons in /usr/bin, the bundled model in
# /usr/share/ringlane/models/stories260K, a user ringlane (10001) - in
# BUILD/images/VARIANT/rootfs - and then, where podman is installed, the image
# ringlane-VARIANT:VERSION from Containerfile.VARIANT (FROM scratch + COPY of
# that filesystem; podman cannot run RUN steps on these machines). The base is
# cached in BUILD/images/base (rebuilt when the library list changes).
# Needs root (debootstrap, chroot) and the Debian package registry.
#
#   deploy/images/build.sh cpu [BUILD]    (BUILD default build-cpu)
#   deploy/images/build.sh cuda [BUILD]   (BUILD default build)
#   (MIRROR, SUITE from the env)
# cpu wants a build without CUDA (`make image-cpu` configures build-cpu with
# -DRINGLANE_WITH_CUDA=OFF) and refuses a worker linking libcudart and libnccl
# (218 MB); cuda wants one with it, and copies the CUDA run-time libraries the
# worker links (from /usr/local/cuda, at the same path: its RUNPATH) into the
# image. The GPU driver comes from the node (the NVIDIA container toolkit).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VARIANT=${1:-cpu}
case "$VARIANT" in cpu) BUILD=${2:-build-cpu} ;; cuda) BUILD=${2:-build} ;; *) echo "images: VARIANT is cpu or cuda" >&2; exit 2 ;; esac
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=${SUITE:-bookworm}
OUT="$BUILD/images"
BASE="$OUT/base"
CTX="$OUT/$VARIANT"
ROOTFS="$CTX/rootfs"
BINS=(worker/ringlane-worker router/ringlane-router kvstore/ringlane-kvstore)
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/deploy/helm/ringlane/Chart.yaml")

die() { echo "images: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "debootstrap and chroot need root"
command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found (apt-get install debootstrap)"
for b in "${BINS[@]}"; do [ -x "$BUILD/$b" ] || die "$BUILD/$b not built"; done
links_cuda=false
if ldd "$BUILD/worker/ringlane-worker" | grep -qE 'libcudart|libnccl'; then links_cuda=true; fi
if [ "$VARIANT" = cpu ] && $links_cuda; then
  die "$BUILD/worker/ringlane-worker links CUDA: build the CPU image from a build configured with -DRINGLANE_WITH_CUDA=OFF"
fi
if [ "$VARIANT" = cuda ] && ! $links_cuda; then
  die "$BUILD/worker/ringlane-worker does not link CUDA: build the CUDA image from a build with the CUDA toolkit"
fi

# The Debian packages holding the libraries the daemons load.
packages=$(for b in "${BINS[@]}"; do ldd "$BUILD/$b"; done |
  awk '/=> \// {print $3}' | sort -u |
  while read -r lib; do
    dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null ||
      dpkg -S "/usr$lib" 2>/dev/null || case "$lib" in /usr/local/cuda/*) ;; *) echo "UNOWNED: $lib" ;; esac
  done | cut -d: -f1 | sort -u | tr '\n' ',' | sed 's/,$//')
case "$packages" in *UNOWNED*) die "a library of the daemons belongs to no Debian package: $packages" ;; esac
echo "images: runtime packages: $packages" >&2

mkdir -p "$OUT"
if [ ! -f "$BASE/.stamp" ] || [ "$(cat "$BASE/.stamp")" != "$SUITE $packages" ]; then
  rm -rf "$BASE"
  echo "images: debootstrap $SUITE (minbase) into $BASE" >&2
  debootstrap --variant=minbase --include="$packages" "$SUITE" "$BASE" "$MIRROR" >"$OUT/debootstrap.log" 2>&1 ||
    { tail -n 20 "$OUT/debootstrap.log" >&2; die "debootstrap failed (log $OUT/debootstrap.log)"; }
  rm -rf "$BASE"/var/cache/apt/archives/*.deb "$BASE"/var/lib/apt/lists/*
  echo "$SUITE $packages" >"$BASE/.stamp"
fi

rm -rf "$CTX"
mkdir -p "$CTX"
cp -a "$BASE" "$ROOTFS"
rm -f "$ROOTFS/.stamp"
# Documentation and locales are not needed at run time.
rm -rf "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/info/* \
  "$ROOTFS"/usr/share/locale/* "$ROOTFS"/var/log/*.log "$ROOTFS"/var/cache/debconf/*-old
for b in "${BINS[@]}"; do
  install -m 0755 "$BUILD/$b" "$ROOTFS/usr/bin/$(basename "$b")"
  strip --strip-debug "$ROOTFS/usr/bin/$(basename "$b")"
done
# The CUDA run-time libraries the worker links (not the driver).
if [ "$VARIANT" = cuda ]; then
  ldd "$BUILD/worker/ringlane-worker" | awk '/=> \/usr\/local\/cuda\// {print $3}' | while read -r lib; do
    mkdir -p "$ROOTFS$(dirname "$lib")"
    cp -L "$lib" "$ROOTFS$lib"
  done
fi
mkdir -p "$ROOTFS/usr/share/ringlane/models"
cp -r "$ROOT/deploy/models/stories260K" "$ROOTFS/usr/share/ringlane/models/"
# The user the chart runs as (runAsUser 10001), with a writable home.
echo "ringlane:x:10001:10001:ringlane:/var/lib/ringlane:/usr/sbin/nologin" >>"$ROOTFS/etc/passwd"
echo "ringlane:x:10001:" >>"$ROOTFS/etc/group"
echo "ringlane:!:19000::::::" >>"$ROOTFS/etc/shadow"
mkdir -p "$ROOTFS/var/lib/ringlane/kvstore"
chown -R 10001:10001 "$ROOTFS/var/lib/ringlane"
cp "$HERE/Containerfile.$VARIANT" "$CTX/Containerfile"
echo "images: rootfs $ROOTFS ($(du -sh "$ROOTFS" | cut -f1))" >&2

if command -v podman >/dev/null 2>&1; then
  podman build --quiet -t "ringlane-$VARIANT:$VERSION" -f "$CTX/Containerfile" "$CTX" >"$OUT/podman-build.log" 2>&1 ||
    { tail -n 20 "$OUT/podman-build.log" >&2; die "podman build failed"; }
  echo "images: podman image ringlane-$VARIANT:$VERSION ($(podman image inspect --format '{{.Size}}' "ringlane-$VARIANT:$VERSION") bytes)" >&2
else
  echo "images: podman not found; the rootfs is built, the image is not" >&2
fi
