//! The device filter of a cgroup v2 job (feature `v2-devices`): an eBPF program attached to
//! the job's cgroup that allows the standard devices and the job's own, by number, and denies
//! every other device, whatever path reaches it. Built with libcgroups' program builder and
//! loaded with libbpf (on kernels from 5.11, which charge BPF memory to the memory cgroup
//! instead of RLIMIT_MEMLOCK, so loading it changes no limit of the shim or the job).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use libcgroups::v2::devices::{bpf, program::Program};
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceType};

use super::plan::DeviceRule;

const LICENSE: &str = "Apache\0";

fn program(rules: &[DeviceRule]) -> Result<Program, String> {
    let rules: Vec<LinuxDeviceCgroup> = rules
        .iter()
        .map(|r| {
            let mut rule = LinuxDeviceCgroup::default();
            rule.set_allow(true)
                .set_typ(Some(LinuxDeviceType::C))
                .set_major(Some(r.major))
                .set_minor(r.minor)
                .set_access(Some(if r.mknod { "rwm" } else { "rw" }.into()));
            rule
        })
        .collect();
    Program::from_rules(&rules, false).map_err(|e| format!("building the device filter: {e}"))
}

/// Loads the filter for `rules` and attaches it to the cgroup open at `cgroup`.
pub(crate) fn attach_filter(cgroup: &OwnedFd, rules: &[DeviceRule]) -> Result<(), String> {
    let prog = program(rules)?;
    let fd = bpf::prog::load(LICENSE, prog.bytecodes()).map_err(|e| {
        format!("loading the device filter: {e} (cgroup v2 device isolation needs Linux 5.11 or later and CAP_SYS_ADMIN)")
    })?;
    // SAFETY: a fresh descriptor we own; closing it after attaching keeps the program, which
    // the cgroup holds.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    bpf::prog::attach(fd.as_raw_fd(), cgroup.as_raw_fd())
        .map_err(|e| format!("attaching the device filter: {e}"))
}

/// Loads (and drops) a filter once, so that libbpf's one-time probe of the kernel is done in
/// the process that forks the shims, and every shim inherits its answer instead of repeating
/// it on the launch path. Best effort.
pub(crate) fn warm_up() {
    if let Ok(prog) = program(&[]) {
        if let Ok(fd) = bpf::prog::load(LICENSE, prog.bytecodes()) {
            // SAFETY: a fresh descriptor we own.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::plan::{Plan, STANDARD_DEVICES};

    fn allows(p: &Program, major: u32, minor: u32, access: &str) -> bool {
        p.execute(LinuxDeviceType::C, major, minor, access.into())
            .unwrap()
            == 1
    }

    #[test]
    fn filter_allows_exactly_the_jobs_devices() {
        let mut spec = crate::conformance::template("j", std::path::Path::new("/r"), 1, 1);
        spec.devices = (2..4)
            .map(|n| crate::DeviceNode {
                host_path: format!("/dev/nvidia{n}").into(),
                path: format!("/dev/nvidia{n}"),
                major: 195,
                minor: n,
            })
            .collect();
        let plan = Plan::new(&spec, "/r".into()).unwrap();
        assert_eq!(plan.devices.len(), STANDARD_DEVICES.len() + 2);
        let p = program(&plan.devices).unwrap();
        assert!(allows(&p, 195, 2, "rw") && allows(&p, 195, 3, "r"));
        assert!(!allows(&p, 195, 3, "m"), "mknod of a job's GPU");
        for minor in [0, 1, 4, 7, 255] {
            assert!(!allows(&p, 195, minor, "r"), "GPU minor {minor}");
        }
        assert!(allows(&p, 1, 3, "rwm") && allows(&p, 136, 9, "rw"));
        assert!(!allows(&p, 8, 0, "r"), "a disk");
    }
}
