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
    need ip || missing="$missing iproute2"
    need python3 || missing="$missing python3"
    # The torch.distributed (gloo, CPU) all-reduce across hosts runs the jobs' python3, the
    # first on their PATH; Debian's own torch is CPU-only.
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        python3 -c 'import torch.distributed' >/dev/null 2>&1 || missing="$missing python3-torch"
    # --begin in the user's time zone is tested with TZ=Europe/Paris.
    [ -e /usr/share/zoneinfo/Europe/Paris ] || missing="$missing tzdata"
    need siftool || missing="$missing siftool"
    need mksquashfs || missing="$missing squashfs-tools"
    [ -e /usr/include/seccomp.h ] || missing="$missing libseccomp-dev"
    need docker || missing="$missing docker.io"
    # Registry pulls are tested against a loopback registry fed by skopeo.
    need docker-registry || missing="$missing docker-registry"
    need skopeo || missing="$missing skopeo"
    need umoci || missing="$missing umoci"
    need htpasswd || missing="$missing apache2-utils"
    # The accounting ledger's PostgreSQL tests start a throwaway server from these binaries.
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
    if [ -n "$missing" ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
    fi
    # The Docker backend's tests need a running engine; start Debian's when none answers.
    if ! docker info >/dev/null 2>&1; then
        echo "== starting the Docker engine"
        (dockerd >/var/log/wharf-tests-dockerd.log 2>&1 &)
        i=0
        until docker info >/dev/null 2>&1; do
            i=$((i + 1))
            [ "$i" -le 60 ] || { echo "dockerd did not start:"; tail -n 20 /var/log/wharf-tests-dockerd.log; exit 1; }
            sleep 1
        done
    fi
fi

# Runs a filtered cargo test and fails unless exactly $1 tests ran (a filter that matches
# nothing must not pass as green).
exactly() {
    want=$1
    shift
    log=$(mktemp)
    status=0
    "$@" >"$log" 2>&1 || status=$?
    cat "$log"
    ran=$(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$log" |
        awk '{ n += $1 + $2 } END { print n + 0 }')
    rm -f "$log"
    [ "$status" = 0 ] || exit "$status"
    if [ "$ran" != "$want" ]; then
        echo "expected $want test(s) to run, but $ran ran: does the filter still name them?"
        exit 1
    fi
}

echo "== fmt"
cargo fmt --all -- --check
echo "== clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
# The runtime also builds without its optional backends (the Docker one is a stand-in then).
cargo clippy -p wharf-runtime --no-default-features --all-targets --quiet -- -D warnings
echo "== tests"
cargo test --workspace --no-fail-fast -- --test-threads=2
echo "== tests of the seccomp feature"
exactly 1 cargo test --features seccomp --test e2e -- --exact sandbox::seccomp_profile_refuses_every_call_it_denies
echo "== quickstart"
./examples/quickstart.sh > /tmp/wharf-quickstart.log 2>&1 || { cat /tmp/wharf-quickstart.log; exit 1; }
tail -n 1 /tmp/wharf-quickstart.log
