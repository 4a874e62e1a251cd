//! What this node has: CPUs, memory, GPUs. Read from the kernel, never configured by hand.

use std::path::Path;

use wharf_api::node::GpuInfo;

/// CPUs this agent may use (its affinity mask), in ascending order. Job CPU index `i` is
/// `cpus[i]`.
pub fn cpus() -> Vec<u32> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count() as u32)
            .filter(|&c| set.is_set(c as usize).unwrap_or(false))
            .collect(),
        Err(_) => (0..std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1))
            .collect(),
    }
}

/// Total memory from `/proc/meminfo`, bytes.
pub fn memory_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// The node's GPUs. The device nodes under `dev_root` decide which GPUs a job can be given;
/// when `dev_root` is the real `/dev` and the driver's NVML library loads, each is described
/// with its model, UUID and memory. A GPU NVML knows but whose device node is missing is left
/// out with a warning (the sandbox could not give it to a job).
pub fn gpus(dev_root: &Path) -> Vec<GpuInfo> {
    let mut found = device_gpus(dev_root);
    if dev_root != Path::new("/dev") {
        return found;
    }
    match nvml_gpus() {
        Ok(described) => {
            for d in described {
                match found.iter_mut().find(|g| g.index == d.index) {
                    Some(g) => *g = d,
                    None => tracing::warn!(
                        index = d.index,
                        model = d.model.as_deref().unwrap_or("?"),
                        "NVML reports a GPU with no /dev/nvidia{} device node; it is not offered \
                         (nvidia-modprobe -c {} creates it)",
                        d.index,
                        d.index
                    ),
                }
            }
        }
        Err(e) => tracing::debug!("NVML not available ({e}); GPUs from device nodes only"),
    }
    found
}

/// GPUs as NVML describes them, indexed by their device minor number (the N of `/dev/nvidiaN`,
/// which is not always NVML's own index).
pub fn nvml_gpus() -> Result<Vec<GpuInfo>, nvml_wrapper::error::NvmlError> {
    use nvml_wrapper::Nvml;
    // Driver installs ship the versioned name; the bare name comes only with development files.
    let nvml = Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
        .or_else(|_| Nvml::init())?;
    let mut gpus = Vec::new();
    for i in 0..nvml.device_count()? {
        let dev = nvml.device_by_index(i)?;
        gpus.push(GpuInfo {
            index: dev.minor_number()?,
            model: dev.name().ok(),
            uuid: dev.uuid().ok(),
            memory: dev.memory_info().ok().map(|m| m.total),
        });
    }
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
}

/// GPUs from the NVIDIA device nodes under `dev_root` (`nvidia0`, `nvidia1`, ...): character
/// devices with NVIDIA's major number 195 and a minor below 255 (255 is nvidiactl).
fn device_gpus(dev_root: &Path) -> Vec<GpuInfo> {
    let Ok(entries) = std::fs::read_dir(dev_root) else {
        return vec![];
    };
    let mut gpus: Vec<GpuInfo> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let index: u32 = name.strip_prefix("nvidia")?.parse().ok()?;
            let node = wharf_runtime::DeviceNode::from_host(&e.path(), "").ok()?;
            (node.major == 195 && node.minor == i64::from(index)).then_some(GpuInfo {
                index,
                model: None,
                uuid: None,
                memory: None,
            })
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    gpus
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_machine() {
        assert!(!cpus().is_empty());
        assert!(memory_total() > 64 << 20);
        let empty = tempfile::tempdir().unwrap();
        assert!(gpus(empty.path()).is_empty());
    }

    #[test]
    fn finds_fake_gpus_made_with_mknod() {
        if !nix::unistd::geteuid().is_root() {
            assert!(
                std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
                "finds_fake_gpus_made_with_mknod needs root"
            );
            eprintln!("SKIPPED finds_fake_gpus_made_with_mknod: mknod needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
            let dev = nix::sys::stat::makedev(195, minor);
            nix::sys::stat::mknod(
                &dir.path().join(name),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                dev,
            )
            .unwrap();
        }
        std::fs::write(dir.path().join("nvidia7"), b"not a device").unwrap();
        let found: Vec<u32> = gpus(dir.path()).iter().map(|g| g.index).collect();
        assert_eq!(found, [0, 1]);
    }
}
