//! What locked-memory limit a sandbox can be given by this process.

/// libcgroups, when it loads a job's device filter on a cgroup v2 host, sets the memlock limit
/// of the process doing it to this (soft and hard), and the container inherits it.
const V2_DEVICE_FILTER_MEMLOCK: u64 = 128 << 20;

/// The capability's bit number (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process may raise hard resource limits (CAP_SYS_RESOURCE in effect).
pub fn can_raise_limits() -> bool {
    proc_self_status("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// A field of `/proc/self/status` (`CapEff`, `Threads`, ...), trimmed.
pub(crate) fn proc_self_status(key: &str) -> Option<String> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')
                .map(|v| v.trim().to_string())
        })
}

/// The most locked memory (bytes; `u64::MAX` = unlimited) this process can give a sandbox:
/// anything with CAP_SYS_RESOURCE (the shim restores the container's limit from outside);
/// otherwise its own hard limit, and on a cgroup v2 host with device filters no more than
/// what libcgroups leaves the container, since that can then never be raised again.
pub fn memlock_ceiling() -> u64 {
    if can_raise_limits() {
        return u64::MAX;
    }
    let hard = hard_memlock();
    if device_filters() {
        hard.min(V2_DEVICE_FILTER_MEMLOCK)
    } else {
        hard
    }
}

/// Why this process cannot make sandboxes here, if it cannot: loading a job's device filter
/// on a cgroup v2 host, libcgroups first sets the memlock limit to 128 MiB, which fails
/// without CAP_SYS_RESOURCE when the hard limit is lower.
pub fn device_filter_problem() -> Option<String> {
    let hard = hard_memlock();
    (device_filters() && !can_raise_limits() && hard < V2_DEVICE_FILTER_MEMLOCK).then(|| {
        format!(
            "this node cannot load a job's device filter: on cgroup v2 that needs a memlock \
             limit of 128 MiB, and the agent's hard limit is {} KiB without CAP_SYS_RESOURCE; \
             run the agent with CAP_SYS_RESOURCE (a systemd service has it) or a hard memlock \
             limit of at least 128 MiB (systemd: LimitMEMLOCK=)",
            hard / 1024
        )
    })
}

/// Whether sandboxes get a cgroup v2 device filter here.
fn device_filters() -> bool {
    cfg!(feature = "v2-devices") && crate::cgroup::is_v2()
}

/// This process's hard memlock limit, bytes (`u64::MAX` = unlimited).
fn hard_memlock() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK)
        .map(|(_, h)| {
            if h == libc::RLIM_INFINITY {
                u64::MAX
            } else {
                h
            }
        })
        .unwrap_or(0)
}
