#!/bin/sh
# Builds a tiny root filesystem from this machine's own programs and their libraries, so an
# image can be imported with no network: mkrootfs.sh DIR [program...]
set -eu
dest=${1:?usage: mkrootfs.sh DIR [program...]}
shift
progs=${*:-sh ls cat id echo sleep true false head dd mount chown env grep ps stat touch readlink}
mkdir -p "$dest"
for d in bin lib lib64 usr/bin usr/lib etc proc sys dev tmp root home; do mkdir -p "$dest/$d"; done
copy() { # copy a file keeping its path, following symlinks
    src=$1
    [ -e "$dest$src" ] && return 0
    mkdir -p "$dest$(dirname "$src")"
    cp -L "$src" "$dest$src"
}
for p in $progs; do
    path=
    for dir in /usr/local/bin /usr/bin /bin /usr/sbin /sbin; do
        if [ -x "$dir/$p" ]; then path=$dir/$p; break; fi
    done
    [ -n "$path" ] || { echo "mkrootfs: $p not found" >&2; exit 1; }
    copy "$path"
    [ "$(dirname "$path")" = /bin ] || ln -sf "$path" "$dest/bin/$p" 2>/dev/null || true
    ldd "$path" 2>/dev/null | grep -o '/[^ ]*' | while read -r lib; do copy "$lib"; done
done
echo "root:x:0:0:root:/root:/bin/sh" > "$dest/etc/passwd"
echo "root:x:0:" > "$dest/etc/group"
chmod 1777 "$dest/tmp"
