#!/bin/sh
# Checks Wharf on a real NVIDIA GPU node, as root: NVML discovery, exact GPU isolation in the
# sandbox, the driver and locked memory inside it, and a real NCCL collective from PyTorch run
# as a Wharf job. CI machines have no GPU, so this is not part of tests/run.sh; run it on a GPU
# node:   tests/gpu-node.sh            (builds wharf)
#         WHARF=path/to/wharf tests/gpu-node.sh
# Prints PASS/FAIL per check and exits 1 if any check failed.
set -u
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "gpu-node: run as root (the agent makes sandboxes)" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "gpu-node: no nvidia-smi: not a GPU node" >&2; exit 1; }
if [ -z "${WHARF:-}" ]; then
    export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/wharf-target}"
    cargo build --quiet --release --bin wharf || exit 1
    WHARF="$CARGO_TARGET_DIR/release/wharf"
fi
fails=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
check() { # check NAME COMMAND...: the command's status decides
    name=$1; shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}
# has TEXT GREP-ARGS...: TEXT (a job's output, say) matches; never evaluated as shell code.
has() { text=$1; shift; printf '%s\n' "$text" | grep -q "$@"; }
lacks() { ! has "$@"; }

echo "== node"
uname -r
nvidia-smi -L
echo "MIG mode: $(nvidia-smi --query-gpu=mig.mode.current --format=csv,noheader 2>&1 | tr '\n' ' ')"
smi_uuids=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | sort)
ngpus=$(echo "$smi_uuids" | grep -c GPU-)
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then echo "cgroup v2"; else echo "cgroup v1/hybrid"; fi
ls -l /dev/nvidia* 2>&1 | head -20
echo "memlock hard limit: $(ulimit -Hl); $(grep CapEff /proc/self/status)"

echo "== discovery (wharf agent --probe)"
"$WHARF" agent --probe
probe=$("$WHARF" agent --probe --json)
probe_uuids=$(echo "$probe" | sed -n 's/.*"uuid": "\(GPU-[^"]*\)".*/\1/p' | sort)
check "NVML finds the $ngpus GPU(s) nvidia-smi lists, by UUID" [ "$probe_uuids" = "$smi_uuids" ]
smi_model=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
check "NVML reports the model ($smi_model)" has "$probe" -F "\"model\": \"$smi_model\""
# nvidia-smi writes 00000000:3B:00.0; the kernel (and Wharf) 0000:3b:00.0.
first_bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1 |
    tr 'A-F' 'a-f' | sed 's/^0000\(....:\)/\1/')
check "NVML reports the first GPU's PCI address ($first_bus) and NVML index 0" \
    has "$(echo "$probe" | tr -d ' \n')" -F "\"nvml_index\":0,\"pci_bus\":\"$first_bus\""
numa=$(cat "/sys/bus/pci/devices/$first_bus/numa_node" 2>/dev/null || echo -1)
echo "first GPU: $first_bus, NUMA node $numa (sysfs)"
if [ "$numa" -ge 0 ] 2>/dev/null; then
    check "the first GPU's NUMA node is sysfs's ($numa)" has "$probe" -F "\"numa_node\": $numa"
else
    check "no NUMA node is claimed where sysfs says none" lacks "$probe" -F '"numa_node"'
fi
inv=$(mktemp -d)
nvidia-smi -q -x > "$inv/smi.xml"
echo "$probe" > "$inv/probe.json"
check "every GPU's minor, NVML index, UUID, model, PCI address and memory match nvidia-smi -q" \
    python3 tests/gpu_inventory.py "$inv/smi.xml" "$inv/probe.json"
rm -rf "$inv"
printf '[agent]\nnvml = false\n' > /tmp/wharf-no-nvml.toml
driver_probe=$("$WHARF" agent --probe --json --config /tmp/wharf-no-nvml.toml)
"$WHARF" agent --probe --config /tmp/wharf-no-nvml.toml
driver_uuids=$(echo "$driver_probe" | sed -n 's/.*"uuid": "\(GPU-[^"]*\)".*/\1/p' | sort)
check "without NVML, the driver's /proc files give the same UUIDs" [ "$driver_uuids" = "$smi_uuids" ]
check "without NVML, the same model" \
    has "$(echo "$driver_probe" | tr -d '\n')" -F "\"model\": \"$smi_model\""
check "without NVML, the first GPU's PCI address" has "$driver_probe" -F "\"pci_bus\": \"$first_bus\""

echo "== a one-node cluster"
data=$(mktemp -d /var/tmp/wharf-gpu.XXXXXX)
chmod 755 "$data"
cp "$WHARF" "$data/wharf" && WHARF="$data/wharf"   # where the job's user can run it
user=wharfgpu
id "$user" >/dev/null 2>&1 || useradd -m -s /bin/sh "$user" || { echo "gpu-node: useradd failed" >&2; exit 1; }
home=$(getent passwd "$user" | cut -d: -f6)
cat > "$data/wharf.toml" <<TOML
[controller]
socket = "$data/wharf.sock"
[agent]
image_store = "$data/images"
grace = "2s"
mounts = ["$home"]
sample_interval = "1s"
TOML
env -u WHARF_SOCKET "$WHARF" dev --config "$data/wharf.toml" --data-dir "$data" 2> "$data/dev.log" &
dev=$!
cleanup() {
    kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null
    [ "$fails" = 0 ] || { echo "== the cluster's log"; tail -40 "$data/dev.log"; }
    rm -rf "$data"
}
trap cleanup EXIT INT TERM
for _ in $(seq 100); do [ -S "$data/wharf.sock" ] && break; sleep 0.1; done
sleep 1
WHARF_SOCKET="$data/wharf.sock" "$WHARF" nodes
# A job run as the unprivileged user, from their home directory, on the node's own filesystem;
# given up after 5 minutes.
job() {
    timeout 300 runuser -u "$user" -- env WHARF_SOCKET="$data/wharf.sock" HOME="$home" \
        sh -c 'cd "$HOME" && exec "$0" run --image host --time 10m "$@"' "$WHARF" "$@"
}
py=$(command -v python3)
smi=$(command -v nvidia-smi)
ldp=${LD_LIBRARY_PATH:-}

echo "== a job given 1 of $ngpus GPU(s)"
out=$(job --gpus 1 --cpus 2 --mem 4G -- sh -c '
    echo "devs: $(ls /dev | grep "^nvidia" | tr "\n" " ")"
    echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES"
    echo "memlock: $(ulimit -l) WHARF_MEMLOCK=$WHARF_MEMLOCK"
    grep CapEff /proc/self/status
    "$0" --query-gpu=uuid --format=csv,noheader
    echo done' "$smi" 2>&1)
echo "$out"
check "the job ran" has "$out" '^done'
gpu_nodes=$(echo "$out" | sed -n 's/^devs: //p' | tr ' ' '\n' | grep -c '^nvidia[0-9][0-9]*$')
check "the job sees exactly 1 /dev/nvidiaN" [ "$gpu_nodes" = 1 ]
check "CUDA_VISIBLE_DEVICES=0 and NVIDIA_VISIBLE_DEVICES names the GPU by UUID" \
    has "$out" '^CUDA_VISIBLE_DEVICES=0 NVIDIA_VISIBLE_DEVICES=GPU-'
visible_is_the_gpu_smi_sees() {
    [ "$(printf '%s\n' "$out" | sed -n 's/^CUDA_VISIBLE_DEVICES=0 NVIDIA_VISIBLE_DEVICES=//p')" = \
        "$(printf '%s\n' "$out" | grep '^GPU-')" ]
}
check "NVIDIA_VISIBLE_DEVICES is the UUID of the GPU nvidia-smi sees in the job" visible_is_the_gpu_smi_sees
one_of_the_nodes_gpus() {
    [ "$(printf '%s\n' "$out" | grep -c '^GPU-')" = 1 ] &&
        has "$smi_uuids" -x "$(printf '%s\n' "$out" | grep '^GPU-')"
}
check "nvidia-smi in the job lists exactly one GPU, one of the node's" one_of_the_nodes_gpus
set -- $(echo "$out" | sed -n 's/^memlock: \([^ ]*\) WHARF_MEMLOCK=\(.*\)/\1 \2/p')
if [ "${2:-}" = unlimited ]; then told=unlimited; else told=$((${2:-0} / 1024)); fi
check "the job's locked-memory limit ($1 KiB) is the one it is told (WHARF_MEMLOCK=${2:-})" [ "${1:-x}" = "$told" ]
capeff=$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status)
# The agent gives a job unlimited locked memory when it may raise limits or already has no
# hard limit, else its own hard limit: never less (no device filter lowers it).
if [ $((0x$capeff >> 24 & 1)) = 1 ] || [ "$(ulimit -Hl)" = unlimited ]; then
    check "locked memory is unlimited in the job" [ "${1:-}" = unlimited ]
else
    check "locked memory in the job is the node's hard limit" [ "${1:-}" = "$(ulimit -Hl)" ]
fi
check "the job has no capabilities" has "$out" 'CapEff:.*0000000000000000'

echo "== a job given no GPU"
out=$(job --cpus 1 --mem 2G -- sh -c '
    echo "devs: $(ls /dev | grep "^nvidia" | tr "\n" " ")"
    "$0" -L >/dev/null 2>&1 && echo "smi: sees a GPU" || echo "smi: no GPU"
    for m in 0 1 2 3 4 5 6 7; do mknod /tmp/g$m c 195 $m 2>/dev/null && echo "mknod: made $m"; done
    ls /proc/1/root/dev | grep -q "^nvidia[0-9]" && echo "proc: host GPU visible"
    echo done' "$smi" 2>&1)
echo "$out"
check "the job ran" has "$out" '^done'
check "no NVIDIA device node in a job without GPUs" has "$out" '^devs: *$'
check "nvidia-smi finds no GPU" has "$out" '^smi: no GPU'
check "mknod of a GPU node is refused in the job" lacks "$out" '^mknod: made'
check "/proc/1/root is the job's own root, without GPUs" lacks "$out" '^proc:'
out=$(job --cpus 1 --mem 4G --env LD_LIBRARY_PATH="$ldp" -- "$py" -c \
    'import torch; print("cuda available:", torch.cuda.is_available())' 2>&1)
echo "$out"
check "PyTorch sees no CUDA device without GPUs" has "$out" 'cuda available: False'

echo "== NCCL all-reduce from PyTorch in a job given 1 GPU"
cat > "$home/nccl_allreduce.py" <<'PY'
import os
import torch
import torch.distributed as dist

assert torch.cuda.device_count() == 1, f"job sees {torch.cuda.device_count()} GPUs"
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29512", rank=0, world_size=1)
x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
ok = bool(torch.equal(x, torch.arange(1 << 20, dtype=torch.float32, device="cuda")))
print("nccl", ".".join(map(str, torch.cuda.nccl.version())), "on", torch.cuda.get_device_name(0),
      "job", os.environ.get("WHARF_JOB_ID"), "allreduce ok" if ok else "allreduce WRONG")
dist.destroy_process_group()
PY
chown "$user" "$home/nccl_allreduce.py"
out=$(job --gpus 1 --cpus 2 --mem 16G --env LD_LIBRARY_PATH="$ldp" --env NCCL_DEBUG=WARN -- \
    "$py" "$home/nccl_allreduce.py" 2>&1)
echo "$out" | tail -20
check "NCCL all-reduce on the job's GPU" has "$out" 'allreduce ok'

echo "== a job with two tasks on one node runs torch.distributed"
cp examples/allreduce_torch.py "$home/allreduce_torch.py"
chown "$user" "$home/allreduce_torch.py"
# NCCL with a GPU of its own for each task where the node has two; else gloo, both tasks
# seeing the node's one GPU.
if [ "$ngpus" -ge 2 ]; then backend=nccl gpus="--gpus-per-task 1"; else backend=gloo gpus="--gpus 1"; fi
out=$(job --ntasks-per-node 2 $gpus --cpus-per-task 2 --mem 16G --env LD_LIBRARY_PATH="$ldp" \
    --env NCCL_DEBUG=WARN -- sh -c '
    echo "tasks job $WHARF_JOB_ID rank $RANK of $WORLD_SIZE local $LOCAL_RANK gpus $CUDA_VISIBLE_DEVICES"
    exec "$0" "$@"' "$py" "$home/allreduce_torch.py" --backend "$backend" --length 1000000 2>&1)
echo "$out" | tail -20
tasks_job=$(printf '%s\n' "$out" | sed -n 's/^tasks job \([0-9][0-9]*\) .*/\1/p' | head -1)
# `wharf run` passes on every task's output, as srun does, and leaves no file behind.
check "rank 0 of 2 all-reduces right with $backend" \
    has "$out" "^allreduce ok rank=0 world=2 sum=[0-9]* backend=$backend"
check "rank 1 of 2 all-reduces right with $backend (its output passed on too)" \
    has "$out" "^allreduce ok rank=1 world=2 sum=[0-9]* backend=$backend"
none_left() {
    [ -n "$tasks_job" ] || return 1
    for f in out err out.rank1 err.rank1; do
        [ ! -e "$home/wharf-$tasks_job.$f" ] || return 1
    done
}
check "no output file is left behind" none_left
same_sum() {
    sums=$(printf '%s\n' "$out" | sed -n 's/^allreduce ok .* sum=\([0-9]*\) .*/\1/p')
    [ "$(printf '%s\n' "$sums" | wc -l)" = 2 ] && [ "$(printf '%s\n' "$sums" | sort -u | wc -l)" = 1 ]
}
check "both ranks hold the same sum" same_sum
one_gpu_each() {
    [ "$(printf '%s\n' "$out" | grep -c '^tasks job .* gpus 0$')" = 2 ]
}
[ "$backend" = gloo ] || check "each task sees one GPU of its own, numbered 0" one_gpu_each

echo "== an unchanged sbatch script: runs once, its srun runs the two ranks"
# As sbatch runs it: the script once, as rank 0; its srun launches torch.distributed in both
# of the job's tasks, each once.
cat > "$home/sbatch_allreduce.sh" <<SH
#!/bin/sh
#SBATCH --ntasks-per-node=2 $(if [ "$ngpus" -ge 2 ]; then echo --gpus-per-task=1; else echo --gpus=1; fi) --cpus-per-task=2 --mem=16G --time=10
echo "batch ran as rank \$SLURM_PROCID of \$SLURM_NTASKS"
echo "batch has cpt=\$SLURM_CPUS_PER_TASK world=\${WORLD_SIZE:-none} nproc=\$(nproc) gpus=\$CUDA_VISIBLE_DEVICES"
srun -l $py $home/allreduce_torch.py --backend $backend --length 1000000
SH
chown "$user" "$home/sbatch_allreduce.sh"
mkdir -p "$data/bin" && ln -sf "$WHARF" "$data/bin/srun"
sb=$(WHARF_SOCKET="$data/wharf.sock" runuser -u "$user" -- sh -c \
    'cd && exec "$0" submit --image host --env LD_LIBRARY_PATH="$1" --env PATH="$2:/usr/bin:/bin" \
        --env NCCL_DEBUG=WARN sbatch_allreduce.sh' "$WHARF" "$ldp" "$data/bin" |
    sed -n 's/^Submitted batch job //p')
for _ in $(seq 600); do
    st=$(WHARF_SOCKET="$data/wharf.sock" "$WHARF" show "${sb:-0}" --json 2>/dev/null |
        sed -n 's/^  "state": "\([A-Z_]*\)".*/\1/p')
    case "$st" in COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL) break ;; esac
    sleep 0.5
done
out=$(cat "$home/wharf-${sb:-none}.out" 2>&1)
echo "$out" | tail -8
check "the sbatch script ended COMPLETED (${st:-none})" [ "$st" = COMPLETED ]
check "it ran once, as rank 0 of 2" \
    [ "$(printf '%s\n' "$out" | grep -c '^batch ran as rank')" = 1 ]
check "and it was rank 0 of 2" has "$out" '^batch ran as rank 0 of 2$'
check "with the job's 4 CPUs, -c as SLURM_CPUS_PER_TASK and no WORLD_SIZE" \
    has "$out" '^batch has cpt=2 world=none nproc=4 gpus='
check "its srun ran rank 0 and rank 1 once each, both all-reducing right" \
    [ "$(printf '%s\n' "$out" | grep -c "allreduce ok rank=[01] world=2 .*backend=$backend")" = 2 ]
check "no output file of a rank past 0" [ ! -e "$home/wharf-${sb:-none}.out.rank1" ]

echo "== measured GPU use: a busy job and an idle one"
cat > "$home/gpu_busy.py" <<'PY'
import time
import torch
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 12
while time.time() < end:
    for _ in range(20):
        y = x @ x
    torch.cuda.synchronize()
import os
print("busy done, job", os.environ["WHARF_JOB_ID"])
PY
chown "$user" "$home/gpu_busy.py"
eff_of() { # eff_of OUTPUT: `wharf eff --json` of the job whose id `wharf run` printed
    id=$(printf '%s\n' "$1" | sed -n 's/.*[Jj]ob \([0-9][0-9]*\).*/\1/p' | head -1)
    WHARF_SOCKET="$data/wharf.sock" "$WHARF" eff "$id" --json
}
out=$(job --gpus 1 --cpus 2 --mem 16G --env LD_LIBRARY_PATH="$ldp" -- "$py" "$home/gpu_busy.py" 2>&1)
echo "$out" | tail -3
busy=$(eff_of "$out")
echo "$busy" | tr -d ' \n' | head -c 600; echo
util=$(echo "$busy" | sed -n 's/.*"gpu_utilization": \([0-9.]*\).*/\1/p' | cut -d. -f1)
energy=$(echo "$busy" | sed -n 's/.*"energy_j": \([0-9]*\).*/\1/p')
gmem=$(echo "$busy" | sed -n 's/.*"memory_peak": \([0-9]*\).*/\1/p' | tail -1)
check "a job running matrix products shows high GPU utilization (${util:-none}%)" [ "${util:-0}" -ge 40 ]
check "its GPU energy is measured (${energy:-none} J)" [ "${energy:-0}" -gt 0 ]
check "its GPU memory peak is measured (${gmem:-none} bytes)" [ "${gmem:-0}" -gt 100000000 ]
out=$(job --gpus 1 --cpus 1 --mem 2G -- sh -c 'echo "idle job $WHARF_JOB_ID"; sleep 5' 2>&1)
idle=$(eff_of "$out")
iutil=$(echo "$idle" | sed -n 's/.*"gpu_utilization": \([0-9.]*\).*/\1/p' | cut -d. -f1)
low_util() { [ -n "$iutil" ] && [ "$iutil" -le 10 ]; }
check "a job that holds a GPU and sleeps shows low utilization (${iutil:-none}%)" low_util
check "and wharf eff says so in a hint" has "$(WHARF_SOCKET="$data/wharf.sock" "$WHARF" eff \
    "$(printf '%s\n' "$out" | sed -n 's/.*[Jj]ob \([0-9][0-9]*\).*/\1/p' | head -1)")" 'GPUs were busy'

echo "== the job's cgroups: a parent with the job's limits, a leaf per task and per step"
if [ -e /sys/fs/cgroup/cgroup.controllers ]; then v2=1 cgroot=/sys/fs/cgroup; else v2=0 cgroot=/sys/fs/cgroup/devices; fi
# The job runs a step beside its batch command, so both kinds of leaf are there at once.
sleeper=$(WHARF_SOCKET="$data/wharf.sock" runuser -u "$user" -- sh -c \
    'cd && exec "$0" submit --image host --gpus 1 --cpus 2 --mem 3G --time 5m \
        --wrap "$0 step -- sleep 50 & sleep 60"' "$WHARF" |
    sed -n 's/^Submitted batch job //p')
# The agent's default cgroup parent is "wharf"; task 0 of job J is the leaf wharf-J/wharf-J,
# task L of step S the leaf wharf-J/wharf-J.sS.L.
jobcg=$cgroot/wharf/wharf-$sleeper
cg=$jobcg/wharf-$sleeper
step_leaf() { find "$jobcg" -maxdepth 1 -type d -name "wharf-$sleeper.s*" 2>/dev/null | head -1; }
for _ in $(seq 200); do
    grep -q . "$cg/cgroup.procs" 2>/dev/null && [ -n "$(step_leaf)" ] &&
        grep -q . "$(step_leaf)/cgroup.procs" 2>/dev/null && break
    sleep 0.1
done
echo "job $sleeper, cgroup $jobcg:"
find "$jobcg" -maxdepth 1 -type d 2>/dev/null | sed "s|^$cgroot/||"
[ -n "$sleeper" ] && grep -q . "$cg/cgroup.procs" 2>/dev/null || { fail "the job's task cgroup appeared"; cg=/nonexistent; }
check "the job's own cgroup holds no process (its tasks and steps are leaves)" \
    sh -c '[ -d "$0" ] && ! grep -q . "$0/cgroup.procs"' "$jobcg"
stepcg=$(step_leaf)
check "a step of the job is a leaf under the job's cgroup, beside its batch task" \
    sh -c '[ -n "$0" ] && grep -q . "$0/cgroup.procs"' "$stepcg"
if [ "$v2" = 1 ]; then
    echo "memory.max: job $(cat "$jobcg/memory.max" 2>&1), task $(cat "$cg/memory.max" 2>&1), step $(cat "$stepcg/memory.max" 2>&1)"
    echo "cpuset.cpus: job $(cat "$jobcg/cpuset.cpus" 2>&1); pids.max: job $(cat "$jobcg/pids.max" 2>&1)"
    check "the job's cgroup holds its --mem (3G) for the batch task and the step together" \
        [ "$(cat "$jobcg/memory.max" 2>/dev/null)" = $((3 * 1024 * 1024 * 1024)) ]
    ncpus() { # the CPUs a cpuset list such as 0-1,4 names
        printf '%s\n' "$1" | tr ',' '\n' | awk -F- 'NF { n += ($2 == "" ? 1 : $2 - $1 + 1) } END { print n + 0 }'
    }
    check "the job's cgroup holds its 2 CPUs" [ "$(ncpus "$(cat "$jobcg/cpuset.cpus" 2>/dev/null)")" = 2 ]
    check "the job's cgroup enables memory, cpuset and pids for its leaves" \
        sh -c 'for c in memory cpuset pids; do grep -qw "$c" "$0/cgroup.subtree_control" || exit 1; done' "$jobcg"
fi

echo "== the device cgroup holds even for host root inside the job's task cgroup"
others=$(ls /dev/nvidia-caps/* /dev/vd? /dev/sd? /dev/nvme?n? 2>/dev/null | head -3)
out=$(sh -c 'echo $$ > "$0/cgroup.procs" || exit; exec "$@"' "$cg" "$py" -c '
import os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDONLY))
        print("open", path, "allowed")
    except OSError as e:
        print("open", path, "refused:", e.strerror)
' /dev/nvidia0 /dev/nvidiactl $others 2>&1)
echo "$out"
check "the allocated GPU opens inside the job's cgroup" has "$out" 'open /dev/nvidia0 allowed'
others_refused() {
    [ -n "$others" ] &&
        ! printf '%s\n' "$out" | grep -v -e /dev/nvidia0 -e /dev/nvidiactl | grep -q allowed
}
check "other devices ($(echo $others)) are refused by the device cgroup" others_refused
WHARF_SOCKET="$data/wharf.sock" "$WHARF" cancel "$sleeper"
for _ in $(seq 100); do
    [ -z "$(find /sys/fs/cgroup -type d -path "*/wharf/wharf-$sleeper" 2>/dev/null)" ] && break
    sleep 0.1
done

echo "== a job's GPU processes, a detached one too, end with it"
# A user's job that leaves a process on the GPU after it ends would hold the next job's GPU
# memory: the job runs one holder in the foreground and one started with setsid, is
# cancelled, and the GPU must be as it was before.
cat > "$home/gpu_hold.py" <<'PY'
import os, time
import torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print("holding 2 GiB, pid", os.getpid(), flush=True)
time.sleep(600)
PY
chown "$user" "$home/gpu_hold.py"
# Over every GPU of the node (the job's may be any), which runs nothing else meanwhile.
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '{ s += $1 } END { print s + 0 }'; }
gpu_apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c '[0-9]'; }
before=$(gpu_used)
holder=$(WHARF_SOCKET="$data/wharf.sock" runuser -u "$user" -- sh -c \
    'cd && exec "$0" submit --image host --gpus 1 --cpus 2 --mem 16G --time 5m \
        --env LD_LIBRARY_PATH="$2" \
        --wrap "setsid $1 gpu_hold.py > detached.log 2>&1 < /dev/null & exec $1 gpu_hold.py"' \
    "$WHARF" "$py" "$ldp" | sed -n 's/^Submitted batch job //p')
for _ in $(seq 120); do
    [ "$(gpu_used)" -ge $((before + 4000)) ] 2>/dev/null && break
    sleep 0.5
done
during=$(gpu_used) apps=$(gpu_apps)
echo "job ${holder:-none}: GPU memory used ${before} MiB before, ${during} MiB while it runs; $apps process(es) on the GPU"
check "both of the job's holders are on the GPU (4 GiB more used)" \
    [ "${during:-0}" -ge $((before + 4000)) ]
WHARF_SOCKET="$data/wharf.sock" "$WHARF" cancel "$holder"
for _ in $(seq 60); do
    [ "$(gpu_used)" -le $((before + 100)) ] 2>/dev/null && [ "$(gpu_apps)" = 0 ] && break
    sleep 0.5
done
after=$(gpu_used) apps=$(gpu_apps)
echo "after the cancel: ${after} MiB used, $apps process(es) on the GPU"
check "after the job, no process of it is left on the GPU, the detached one too" [ "$apps" = 0 ]
check "and the GPU memory it held is free again (${after} MiB used, ${before} before)" \
    [ "${after:-99999}" -le $((before + 100)) ]
state=$(WHARF_SOCKET="$data/wharf.sock" "$WHARF" show "$holder" --json |
    sed -n 's/^  "state": "\([A-Z_]*\)".*/\1/p')
check "the job ended CANCELLED (${state:-none})" [ "$state" = CANCELLED ]

echo "== steps of one job: a GPU of their own, and one that waits while it is held"
# The job holds 1 GPU; its first step takes it (--gres gpu:1) for 4 s, the second asks for
# it meanwhile, waits, and runs once the first has ended.
out=$(job --gpus 1 --cpus 2 --mem 4G -- sh -c '
    rm -f first.held
    "$0" step --gres gpu:1 -- sh -c "echo first: \$(\"$1\" -L | grep -c GPU); touch first.held; sleep 4" &
    while [ ! -e first.held ]; do sleep 0.1; done
    "$0" step --gres gpu:1 -- sh -c "echo second: \$(\"$1\" -L | grep -c GPU)"
    wait' "$WHARF" "$smi" 2>&1)
echo "$out"
check "the first step sees the job's GPU" has "$out" '^first: 1$'
check "the second waited while the first held it" has "$out" 'step waiting: GPUs held by step'
check "and ran with the GPU once the first ended" has "$out" '^second: 1$'

echo "== a signal for a running GPU job's program, which goes on"
cat > "$home/gpu_usr1.py" <<'PY'
import signal, time
import torch
x = torch.ones(1 << 20, device="cuda")
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
print("ready", flush=True)
while not got:
    time.sleep(0.1)
print("checkpoint on USR1, sum", int(x.sum().item()), flush=True)
time.sleep(600)
PY
chown "$user" "$home/gpu_usr1.py"
sig=$(WHARF_SOCKET="$data/wharf.sock" runuser -u "$user" -- sh -c \
    'cd && exec "$0" submit --image host --gpus 1 --cpus 2 --mem 8G --time 5m -o usr1.out \
        --env LD_LIBRARY_PATH="$2" --wrap "exec $1 gpu_usr1.py"' "$WHARF" "$py" "$ldp" |
    sed -n 's/^Submitted batch job //p')
for _ in $(seq 240); do grep -q ready "$home/usr1.out" 2>/dev/null && break; sleep 0.5; done
WHARF_SOCKET="$data/wharf.sock" runuser -u "$user" -- "$WHARF" cancel --signal USR1 "${sig:-none}"
for _ in $(seq 60); do grep -q checkpoint "$home/usr1.out" 2>/dev/null && break; sleep 0.5; done
cat "$home/usr1.out" 2>/dev/null
check "the job's program took USR1 and went on" has "$(cat "$home/usr1.out" 2>/dev/null)" \
    '^checkpoint on USR1, sum 1048576$'
state=$(WHARF_SOCKET="$data/wharf.sock" "$WHARF" show "${sig:-none}" --json |
    sed -n 's/^  "state": "\([A-Z_]*\)".*/\1/p')
check "the job is still RUNNING after the signal (${state:-none})" [ "$state" = RUNNING ]
WHARF_SOCKET="$data/wharf.sock" "$WHARF" cancel "${sig:-none}"
for _ in $(seq 60); do
    st=$(WHARF_SOCKET="$data/wharf.sock" "$WHARF" show "${sig:-none}" --json |
        sed -n 's/^  "state": "\([A-Z_]*\)".*/\1/p')
    [ "$st" = CANCELLED ] && break
    sleep 0.5
done

echo "== after the jobs"
left=$(find /sys/fs/cgroup -type d -path '*/wharf/wharf-*' 2>/dev/null | head -5)
check "no job cgroup is left" [ -z "$left" ]
WHARF_SOCKET="$data/wharf.sock" "$WHARF" queue --all
echo "gpu-node: $fails check(s) failed"
[ "$fails" = 0 ]
