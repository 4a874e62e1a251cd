#!/bin/sh
# Builds Wharf, starts a one-machine cluster (`wharf dev`) with embedded defaults in a
# throw-away directory, imports a tiny image made from this machine's own programs, runs the
# example jobs and shows the queue and their output. Needs root (the agent makes sandboxes)
# and no network.
set -eu
cd "$(dirname "$0")/.."
repo=$(pwd)
[ "$(id -u)" = 0 ] || { echo "quickstart: run as root (the node agent creates sandboxes)" >&2; exit 1; }
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/wharf-target}"
./examples/build-deps.sh
cargo build --quiet --bin wharf
wharf="$CARGO_TARGET_DIR/debug/wharf"

data=$(mktemp -d /var/tmp/wharf-quickstart.XXXXXX)
chmod 755 "$data"
cat > "$data/wharf.toml" <<TOML
[controller]
socket = "$data/wharf.sock"
[agent]
image_store = "$data/images"
grace = "2s"
TOML
export WHARF_SOCKET="$data/wharf.sock" WHARF_IMAGE_STORE="$data/images"
# The configuration names the socket; a WHARF_SOCKET in the environment would move it.
env -u WHARF_SOCKET "$wharf" dev --config "$data/wharf.toml" --data-dir "$data" 2> "$data/dev.log" &
dev=$!
cleanup() { kill "$dev" 2>/dev/null || true; wait "$dev" 2>/dev/null || true; rm -rf "$data"; }
trap cleanup EXIT INT TERM

echo "== import an image built from this machine's programs"
./examples/mkrootfs.sh "$data/rootfs"
"$wharf" image import "$data/rootfs" --name tiny

echo "== nodes"
for _ in $(seq 100); do
    "$wharf" nodes --json 2>/dev/null | grep -q '"tiny"' && break
    # It stops at once on what it cannot use (another agent's cgroup parent, a bad setting).
    kill -0 "$dev" 2>/dev/null || { echo "wharf dev stopped:" >&2; cat "$data/dev.log" >&2; exit 1; }
    sleep 0.2
done
"$wharf" nodes


cd "$data"
echo "== wharf run: a command in the sandbox, output streamed"
"$wharf" run --image tiny -- /bin/sh -c 'echo "uid $(id -u) on $WHARF_NODE, job $WHARF_JOB_ID"; touch /x || echo "(the root is read-only)"'

echo "== wharf submit: a job file and a #WHARF script"
"$wharf" submit "$repo/examples/hello.toml"
"$wharf" submit "$repo/examples/train.sh"
"$wharf" queue
for _ in $(seq 100); do
    [ -z "$("$wharf" queue --json | grep '"id"')" ] && break
    sleep 0.2
done
echo "== queue --all"
"$wharf" queue --all
echo "== outputs"
for f in wharf-*.out train-*.out; do echo "--- $f"; cat "$f"; done
"$wharf" queue --all --json | grep -q '"FAILED"\|"NODE_FAIL"' && { echo "a job failed" >&2; exit 1; }
echo "quickstart: ok"
