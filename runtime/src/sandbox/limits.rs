//! What locked-memory limit a sandbox can be given by this process.

/// The capability's bit number (linux/capability.h).
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this process may raise hard resource limits (CAP_SYS_RESOURCE in effect).
pub fn can_raise_limits() -> bool {
    crate::sys::proc_self_status("CapEff")
        .and_then(|v| u64::from_str_radix(&v, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// The most locked memory (bytes; `u64::MAX` = unlimited) this process can give a sandbox:
/// anything with CAP_SYS_RESOURCE, otherwise its own hard limit (the container inherits the
/// shim's limit, and inside its user namespace it could never be raised).
pub fn memlock_ceiling() -> u64 {
    if can_raise_limits() {
        return u64::MAX;
    }
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
