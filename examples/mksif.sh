#!/bin/sh
# Packs a root filesystem directory into an Apptainer SIF file, as `apptainer build` would
# lay it out: a squashfs primary system partition. mksif.sh ROOTFS OUT.sif
# Needs mksquashfs (squashfs-tools) and siftool (Debian packages of those names).
set -eu
rootfs=${1:?usage: mksif.sh ROOTFS OUT.sif}
out=${2:?usage: mksif.sh ROOTFS OUT.sif}
case "$(uname -m)" in
    x86_64) arch=2 ;;
    aarch64) arch=4 ;;
    *) echo "mksif: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
sqfs="$out.sqfs.$$"
trap 'rm -f "$sqfs"' EXIT
mksquashfs "$rootfs" "$sqfs" -noappend -quiet -all-root >/dev/null
rm -f "$out"
siftool new "$out"
siftool add "$out" "$sqfs" --datatype 4 --parttype 2 --partfs 1 --partarch "$arch" >/dev/null
chmod 644 "$out"
