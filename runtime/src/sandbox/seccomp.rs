//! The default seccomp profile (feature `seccomp`, which links libseccomp): every system call
//! is allowed except those a batch job never needs and that widen the kernel's attack
//! surface, which fail with EPERM. Jobs have no capabilities already; this also closes calls
//! that need none (keyrings, userfaultfd, perf, bpf) or that a future capability bug would
//! open (module loading, kexec, mounts, clock and swap changes).

use libseccomp::{ScmpAction, ScmpArch, ScmpFilterContext, ScmpSyscall};

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

/// The system calls the profile refuses with EPERM, by name (for tests and documentation).
pub fn denied_calls() -> &'static [&'static str] {
    &DENIED
}

/// Architectures the filter also covers, besides the native one: a job must not dodge it
/// through another ABI (i386 or x32 calls on x86_64, arm on aarch64).
const ARCHES: [ScmpArch; 5] = [
    ScmpArch::X8664,
    ScmpArch::X86,
    ScmpArch::X32,
    ScmpArch::Aarch64,
    ScmpArch::Arm,
];

/// Builds the profile and loads it into the calling process (no_new_privs must be set).
pub(crate) fn load() -> Result<(), String> {
    let e = |e: libseccomp::error::SeccompError| e.to_string();
    let mut filter = ScmpFilterContext::new(ScmpAction::Allow).map_err(e)?;
    // Only the architectures this kernel runs (the native one and its compat ABIs).
    for arch in ARCHES {
        if arch != ScmpArch::native() {
            let _ = filter.add_arch(arch);
        }
    }
    for name in DENIED {
        // A call this libseccomp does not know cannot be made by name either.
        if let Ok(call) = ScmpSyscall::from_name(name) {
            filter
                .add_rule(ScmpAction::Errno(libc::EPERM), call)
                .map_err(e)?;
        }
    }
    filter.load().map_err(e)
}
