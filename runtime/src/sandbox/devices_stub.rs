//! Without the `v2-devices` feature a cgroup v2 job gets no device filter: only the devices
//! bound into its private `/dev` are reachable there, and nothing denies a device by number.

use std::os::fd::OwnedFd;

use super::plan::DeviceRule;

/// Attaches nothing.
pub(crate) fn attach_filter(_cgroup: &OwnedFd, _rules: &[DeviceRule]) -> Result<(), String> {
    Ok(())
}

/// Nothing to warm up.
pub(crate) fn warm_up() {}
