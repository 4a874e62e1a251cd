//! The default seccomp profile (feature `seccomp`, which links libseccomp): every system call
//! is allowed except those a batch job never needs and that widen the kernel's attack
//! surface, which fail with EPERM. Jobs have no capabilities already; this also closes calls
//! that need none (keyrings, userfaultfd, perf, bpf) or that a future capability bug would
//! open (module loading, kexec, mounts, clock and swap changes).

use serde_json::{json, Value};

/// Refused system calls.
const DENIED: [&str; 27] = [
    "acct",
    "add_key",
    "bpf",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "finit_module",
    "init_module",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount",
    "move_mount",
    "open_by_handle_at",
    "perf_event_open",
    "pivot_root",
    "quotactl",
    "reboot",
    "request_key",
    "settimeofday",
    "swapoff",
    "swapon",
    "umount2",
    "userfaultfd",
    "fsopen",
];

/// The profile for the OCI spec's `linux.seccomp`.
pub(crate) fn profile() -> Option<Value> {
    Some(json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
        "syscalls": [{ "names": DENIED, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM }],
    }))
}
