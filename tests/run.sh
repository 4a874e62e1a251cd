#!/bin/sh
# The whole test suite, as CI runs it: installs what the tests need on a fresh Debian machine,
# checks formatting, lints and dependency rules, runs every test (as root, real sandboxes) and
# the README's quickstart.
set -eu
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/wharf-target}"
export WHARF_TEST_STRICT="${WHARF_TEST_STRICT:-1}"

need() { command -v "$1" >/dev/null 2>&1; }
./examples/build-deps.sh
if [ "$(id -u)" = 0 ]; then
    missing=""
    need setpriv || missing="$missing util-linux"
    need useradd || missing="$missing passwd"
    need pgrep || missing="$missing procps"
    need siftool || missing="$missing siftool"
    need mksquashfs || missing="$missing squashfs-tools"
    [ -e /usr/include/seccomp.h ] || missing="$missing libseccomp-dev"
    if [ -n "$missing" ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
    fi
fi

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== tests"
cargo test --workspace --no-fail-fast -- --test-threads=2
echo "== tests of the seccomp feature"
cargo test --features seccomp --test e2e -- --exact sandbox::seccomp_profile_refuses_kernel_keyrings_and_friends
echo "== quickstart"
./examples/quickstart.sh > /tmp/wharf-quickstart.log 2>&1 || { cat /tmp/wharf-quickstart.log; exit 1; }
tail -n 1 /tmp/wharf-quickstart.log
