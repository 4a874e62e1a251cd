#!/bin/sh
# Installs, as root on Debian, what building Wharf needs besides a Rust toolchain: a C compiler
# and make, pkg-config, and libelf and zlib for libbpf (the cgroup v2 device filter). Does
# nothing when they are there.
set -eu
have() { command -v "$1" >/dev/null 2>&1; }
missing=""
have cc || missing="$missing gcc libc6-dev"
have make || missing="$missing make"
have pkg-config || missing="$missing pkg-config"
[ -e /usr/include/libelf.h ] || missing="$missing libelf-dev"
[ -e /usr/include/zlib.h ] || missing="$missing zlib1g-dev"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ] || ! have apt-get; then
    echo "build-deps: install these first:$missing" >&2
    exit 1
fi
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
