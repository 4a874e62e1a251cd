//! What this node has: CPUs, memory, GPUs. Read from the kernel, never configured by hand.

use std::path::Path;

use wharf_api::node::{GpuInfo, GpuUnit, MigInfo};

/// What the agent found on its node: the CPUs jobs are given (job CPU index → CPU id) and
/// the GPUs (by device minor, the id the scheduler allocates).
#[derive(Debug, Clone, Default)]
pub struct Machine {
    /// The agent's CPUs, ascending.
    pub cpus: Vec<u32>,
    /// The GPUs found.
    pub gpus: Vec<GpuInfo>,
    /// NUMA node of each CPU of `cpus` (empty: one node, or the kernel does not say).
    pub cpu_numa: Vec<u32>,
}

impl Machine {
    /// The GPU with device minor `id`, as described at discovery (only its number when it
    /// was not described).
    pub fn gpu(&self, id: u32) -> GpuInfo {
        self.gpus
            .iter()
            .find(|g| g.index == id)
            .cloned()
            .unwrap_or_else(|| GpuInfo::minor(id))
    }

    /// The GPU unit the scheduler gave by `id`: a whole GPU (only its number when it was not
    /// described), or a MIG instance; `None` for a MIG instance this node does not have.
    pub fn unit(&self, id: u32) -> Option<GpuUnit> {
        if let Some(unit) = wharf_api::node::gpu_unit(&self.gpus, id) {
            return Some(unit);
        }
        if wharf_api::node::mig_slot(id).is_some() {
            return None;
        }
        let gpu = self.gpu(id);
        Some(GpuUnit {
            id,
            kind: gpu.kind(),
            gpu,
            mig: None,
        })
    }
}

/// Where the driver lists the capability devices of MIG instances.
const MIG_CAPS_PROC: &str = "/proc/driver/nvidia/capabilities";

/// The minors of the capability devices that open MIG instance `ci` of GPU instance `gi` on
/// the GPU of minor `gpu`: the GPU instance's `access` and the compute instance's, each a
/// file saying `DeviceFileMinor: N` under `proc` (the driver's capabilities directory).
/// Empty when either is missing.
pub fn mig_caps(proc: &Path, gpu: u32, gi: u32, ci: u32) -> Vec<u32> {
    let gi_dir = proc.join(format!("gpu{gpu}/mig/gi{gi}"));
    let minor = |file: &Path| -> Option<u32> {
        std::fs::read_to_string(file)
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("DeviceFileMinor:"))?
            .trim()
            .parse()
            .ok()
    };
    match (
        minor(&gi_dir.join("access")),
        minor(&gi_dir.join(format!("ci{ci}/access"))),
    ) {
        (Some(g), Some(c)) => vec![g, c],
        _ => vec![],
    }
}

/// The GPU and compute instance ids of MIG device `m` (NVML calls the wrapper does not
/// offer); `None` when the library lacks them.
fn mig_instance_ids(nvml: &nvml_wrapper::Nvml, m: &nvml_wrapper::Device) -> Option<(u32, u32)> {
    let lib = nvml.lib();
    let gi_of = lib.nvmlDeviceGetGpuInstanceId.as_ref().ok()?;
    let ci_of = lib.nvmlDeviceGetComputeInstanceId.as_ref().ok()?;
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: `m` is a live device handle of this library (it outlives the calls), and
    // each call writes one unsigned int through a pointer to a local.
    let ok = unsafe { gi_of(m.handle(), &mut gi) == 0 && ci_of(m.handle(), &mut ci) == 0 };
    ok.then_some((gi, ci))
}

/// The address of network interface `name` (IPv4 before IPv6, no link-local IPv6), as
/// jobs on other nodes reach this one over it; `None` with a warning when it has none.
pub fn interface_address(name: &str) -> Option<String> {
    let mut found: Vec<std::net::IpAddr> = nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|i| i.interface_name == name)
        .filter_map(|i| {
            let a = i.address?;
            a.as_sockaddr_in()
                .map(|v4| std::net::IpAddr::V4(v4.ip()))
                .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
        })
        .filter(
            |ip| !matches!(ip, std::net::IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80),
        )
        .collect();
    found.sort_by_key(|ip| ip.is_ipv6());
    let first = found.first().map(|ip| ip.to_string());
    if first.is_none() {
        tracing::warn!(
            interface = name,
            "agent.fabric_interface has no address; jobs are given the node's name as MASTER_ADDR"
        );
    }
    first
}

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

/// The NVIDIA driver's proc directory (`gpus/<PCI address>/information`).
const DRIVER_PROC: &str = "/proc/driver/nvidia";
/// sysfs (`bus/pci/devices`, `devices/system/node`).
const SYS: &str = "/sys";

/// The node's GPUs. The device nodes under `dev_root` decide which GPUs a job can be given;
/// when `dev_root` is the real `/dev`, each is described by NVML when `nvml` is set and the
/// driver's library loads, else by the driver's `/proc` files; its NUMA node and PCIe
/// switch come from sysfs. A GPU described but with no device node is left out with a
/// warning (the sandbox could not give it to a job).
pub fn gpus(dev_root: &Path, nvml: bool) -> Vec<GpuInfo> {
    let found = device_gpus(dev_root);
    if dev_root != Path::new("/dev") {
        return found;
    }
    let described = if nvml {
        nvml_gpus().unwrap_or_else(|e| {
            tracing::debug!("NVML not available ({e}); GPUs described by the driver's files");
            driver_gpus(Path::new(DRIVER_PROC))
        })
    } else {
        driver_gpus(Path::new(DRIVER_PROC))
    };
    describe(found, described, Path::new(SYS))
}

/// The device-node GPUs, each replaced by its description (matched by device minor) and
/// given its place in the machine from sysfs.
fn describe(mut found: Vec<GpuInfo>, described: Vec<GpuInfo>, sys: &Path) -> Vec<GpuInfo> {
    for d in described {
        match found.iter_mut().find(|g| g.index == d.index) {
            Some(g) => *g = d,
            None => tracing::warn!(
                index = d.index,
                model = d.model.as_deref().unwrap_or("?"),
                "the driver reports a GPU with no /dev/nvidia{} device node; it is not \
                 offered (nvidia-modprobe -c {} creates it)",
                d.index,
                d.index
            ),
        }
    }
    for g in &mut found {
        if let Some(bus) = &g.pci_bus {
            let (numa, switch) = pci_place(sys, bus);
            g.numa_node = g.numa_node.or(numa);
            g.pcie_switch = g.pcie_switch.take().or(switch);
        }
    }
    found
}

/// GPUs as NVML describes them, indexed by their device minor number (the N of `/dev/nvidiaN`,
/// which is not always NVML's own index), with their MIG instances when MIG mode is on.
pub fn nvml_gpus() -> Result<Vec<GpuInfo>, nvml_wrapper::error::NvmlError> {
    let nvml = open_nvml()?;
    let mut gpus = Vec::new();
    for i in 0..nvml.device_count()? {
        let dev = nvml.device_by_index(i)?;
        let minor = dev.minor_number()?;
        let mig_on = dev.mig_mode().is_ok_and(|m| m.current == 1);
        let mig = if mig_on {
            (0..dev.mig_device_count().unwrap_or(0))
                .filter_map(|j| dev.mig_device_by_index(j).ok())
                .filter_map(|m| {
                    let caps = mig_instance_ids(&nvml, &m)
                        .map(|(gi, ci)| mig_caps(Path::new(MIG_CAPS_PROC), minor, gi, ci))
                        .unwrap_or_default();
                    Some(MigInfo {
                        uuid: m.uuid().ok()?,
                        profile: mig_profile(&m.name().ok()?)?,
                        memory: m.memory_info().ok().map(|x| x.total),
                        caps,
                    })
                })
                .collect()
        } else {
            vec![]
        };
        gpus.push(GpuInfo {
            index: minor,
            model: dev.name().ok(),
            uuid: dev.uuid().ok(),
            memory: dev.memory_info().ok().map(|m| m.total),
            nvml_index: Some(i),
            pci_bus: dev.pci_info().ok().and_then(|p| pci_address(&p.bus_id)),
            numa_node: None,
            pcie_switch: None,
            mig,
        });
    }
    gpus.sort_by_key(|g| g.index);
    Ok(gpus)
}

/// Loads the driver's NVML library. Driver installs ship the versioned name; the bare name
/// comes only with development files.
pub fn open_nvml() -> Result<nvml_wrapper::Nvml, nvml_wrapper::error::NvmlError> {
    nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
        .init()
        .or_else(|_| nvml_wrapper::Nvml::init())
}

/// The profile in a MIG device's name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb" is `1g.10gb`.
fn mig_profile(name: &str) -> Option<String> {
    let last = name.split_whitespace().last()?;
    (last.contains("g.") && last.starts_with(|c: char| c.is_ascii_digit()))
        .then(|| last.to_string())
}

/// A PCI address in the kernel's form (`0000:3b:00.0`) from NVML's (`00000000:3B:00.0`):
/// four hex digits of domain, lower case.
fn pci_address(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.trim().split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let (bus, devfn) = rest.split_once(':')?;
    let (dev, func) = devfn.split_once('.')?;
    let ok = |s: &str, n: usize| s.len() == n && s.chars().all(|c| c.is_ascii_hexdigit());
    (domain <= 0xffff && ok(bus, 2) && ok(dev, 2) && ok(func, 1))
        .then(|| format!("{domain:04x}:{bus}:{dev}.{func}").to_ascii_lowercase())
}

/// GPUs as the driver's `/proc` files describe them (`gpus/<address>/information`: model,
/// UUID, bus location, device minor), for nodes where NVML is absent or turned off.
pub fn driver_gpus(driver: &Path) -> Vec<GpuInfo> {
    let Ok(entries) = std::fs::read_dir(driver.join("gpus")) else {
        return vec![];
    };
    let mut gpus: Vec<GpuInfo> = entries
        .flatten()
        .filter_map(|e| {
            let text = read_small(&e.path().join("information"))?;
            let field = |key: &str| {
                text.lines().find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    (k.trim() == key).then(|| v.trim().to_string())
                })
            };
            let dir_name = e.file_name().to_string_lossy().into_owned();
            Some(GpuInfo {
                index: field("Device Minor")?.parse().ok()?,
                model: field("Model").filter(|m| !m.is_empty()),
                uuid: field("GPU UUID").filter(|u| u.starts_with("GPU-")),
                pci_bus: field("Bus Location")
                    .and_then(|b| pci_address(&b))
                    .or_else(|| pci_address(&dir_name)),
                ..GpuInfo::default()
            })
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    gpus.dedup_by_key(|g| g.index);
    gpus
}

/// A small text file (a sysfs or proc attribute); `None` when unreadable or not text.
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(64 << 10)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// Where the PCI device at `address` sits: its NUMA node (none where the kernel says -1)
/// and the bridge above its own port when there is one (a PCIe switch's upstream port),
/// named by that bridge's address.
fn pci_place(sys: &Path, address: &str) -> (Option<u32>, Option<String>) {
    let dev = sys.join("bus/pci/devices").join(address);
    let numa = read_small(&dev.join("numa_node")).and_then(|t| t.trim().parse::<u32>().ok());
    let switch = std::fs::canonicalize(&dev).ok().and_then(|real| {
        // .../pci0000:00/<root port>/<switch upstream>/<switch downstream>/<gpu>
        let port = real.parent()?;
        let above = port.parent()?;
        let name = above.file_name()?.to_str()?;
        pci_address(name).filter(|a| a == name)
    });
    (numa, switch)
}

/// The NUMA node of each CPU in `cpus` (the agent's CPUs, job CPU index order), from
/// `devices/system/node/node*/cpulist`; empty where there is one node or the kernel does
/// not say for every CPU.
pub fn cpu_numa(sys: &Path, cpus: &[u32]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(sys.join("devices/system/node")) else {
        return vec![];
    };
    let mut node_of = std::collections::BTreeMap::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(node) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Some(list) = read_small(&e.path().join("cpulist")) else {
            continue;
        };
        for cpu in parse_cpu_list(list.trim()) {
            node_of.insert(cpu, node);
        }
    }
    let nodes: std::collections::BTreeSet<u32> = node_of.values().copied().collect();
    if nodes.len() < 2 {
        return vec![];
    }
    cpus.iter()
        .map(|c| node_of.get(c).copied())
        .collect::<Option<Vec<u32>>>()
        .unwrap_or_default()
}

/// A kernel CPU list (`0-3,8,10-11`); malformed parts are skipped, ranges bounded.
fn parse_cpu_list(list: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(lo), Ok(hi)) = (lo.parse::<u32>(), hi.parse::<u32>()) {
            if lo <= hi && hi - lo < 1 << 16 {
                cpus.extend(lo..=hi);
            }
        }
    }
    cpus
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
            (node.major == 195 && node.minor == i64::from(index)).then_some(GpuInfo::minor(index))
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    gpus
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_mig_instances_capability_devices_are_read_from_the_drivers_files() {
        let proc = tempfile::tempdir().unwrap();
        let gi = proc.path().join("gpu1/mig/gi2");
        std::fs::create_dir_all(gi.join("ci0")).unwrap();
        std::fs::write(
            gi.join("access"),
            "DeviceFileMinor: 21\nDeviceFileMode: 292\n",
        )
        .unwrap();
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 22\n").unwrap();
        assert_eq!(mig_caps(proc.path(), 1, 2, 0), [21, 22]);
        // Another compute instance, GPU instance or GPU: nothing known.
        assert!(mig_caps(proc.path(), 1, 2, 1).is_empty());
        assert!(mig_caps(proc.path(), 1, 3, 0).is_empty());
        assert!(mig_caps(proc.path(), 0, 2, 0).is_empty());
    }

    use super::*;

    #[test]
    fn reads_this_machine() {
        assert!(!cpus().is_empty());
        assert!(memory_total() > 64 << 20);
        let empty = tempfile::tempdir().unwrap();
        assert!(gpus(empty.path(), true).is_empty());
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
        let found: Vec<u32> = gpus(dir.path(), true).iter().map(|g| g.index).collect();
        assert_eq!(found, [0, 1]);
    }

    /// A scratch machine: the driver's proc files for GPUs with minors 0, 1 and 3 (on two
    /// NUMA nodes, 0 and 1 behind one PCIe switch, 3 on a root port of its own), sysfs for
    /// them and for two NUMA nodes of two CPUs each.
    fn fake_machine() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let gpus = [
            (
                "0000:1b:00.0",
                0,
                "pci0000:00/0000:00:01.0/0000:18:00.0/0000:19:08.0",
                0,
            ),
            (
                "0000:1c:00.0",
                1,
                "pci0000:00/0000:00:01.0/0000:18:00.0/0000:19:10.0",
                0,
            ),
            ("0000:ca:00.0", 3, "pci0000:c0/0000:c0:03.0", 1),
        ];
        for (addr, minor, path, numa) in gpus {
            let info = r.join("driver/gpus").join(addr);
            std::fs::create_dir_all(&info).unwrap();
            std::fs::write(
                info.join("information"),
                format!(
                    "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n\
                     GPU UUID: \t GPU-0000000{minor}-aaaa-bbbb-cccc-dddddddddddd\n\
                     Bus Location: \t {addr}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
                ),
            )
            .unwrap();
            let real = r.join("sys/devices").join(path).join(addr);
            std::fs::create_dir_all(&real).unwrap();
            std::fs::write(real.join("numa_node"), format!("{numa}\n")).unwrap();
            std::fs::create_dir_all(r.join("sys/bus/pci/devices")).unwrap();
            std::os::unix::fs::symlink(&real, r.join("sys/bus/pci/devices").join(addr)).unwrap();
        }
        for (node, list) in [(0, "0-1"), (1, "2-3")] {
            let dir = r.join(format!("sys/devices/system/node/node{node}"));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("cpulist"), format!("{list}\n")).unwrap();
        }
        root
    }

    #[test]
    fn the_driver_files_and_sysfs_describe_gpus_by_device_minor() {
        let m = fake_machine();
        let described = driver_gpus(&m.path().join("driver"));
        let found = vec![GpuInfo::minor(0), GpuInfo::minor(1), GpuInfo::minor(3)];
        let gpus = describe(found, described, &m.path().join("sys"));
        let ids: Vec<u32> = gpus.iter().map(|g| g.index).collect();
        assert_eq!(ids, [0, 1, 3]);
        let g3 = &gpus[2];
        assert_eq!(g3.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(g3.kind(), "h100");
        assert_eq!(
            g3.uuid.as_deref(),
            Some("GPU-00000003-aaaa-bbbb-cccc-dddddddddddd")
        );
        assert_eq!(g3.pci_bus.as_deref(), Some("0000:ca:00.0"));
        assert_eq!(g3.numa_node, Some(1));
        assert_eq!(g3.pcie_switch, None, "GPU 3 sits on a root port");
        assert_eq!(gpus[0].numa_node, Some(0));
        assert_eq!(gpus[0].pcie_switch.as_deref(), Some("0000:18:00.0"));
        assert_eq!(gpus[0].pcie_switch, gpus[1].pcie_switch);
    }

    #[test]
    fn a_described_gpu_without_a_device_node_is_not_offered() {
        let m = fake_machine();
        let described = driver_gpus(&m.path().join("driver"));
        let gpus = describe(vec![GpuInfo::minor(1)], described, &m.path().join("sys"));
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].index, 1);
        assert!(gpus[0].uuid.as_deref().unwrap().starts_with("GPU-00000001"));
    }

    #[test]
    fn cpus_are_mapped_to_their_numa_nodes_in_job_index_order() {
        let m = fake_machine();
        let sys = m.path().join("sys");
        assert_eq!(cpu_numa(&sys, &[0, 1, 2, 3]), [0, 0, 1, 1]);
        // An agent confined to CPUs 1 and 2: job CPU 0 is host CPU 1.
        assert_eq!(cpu_numa(&sys, &[1, 2]), [0, 1]);
        // A CPU the kernel puts on no node: no topology rather than a wrong one.
        assert!(cpu_numa(&sys, &[0, 9]).is_empty());
        std::fs::remove_dir_all(sys.join("devices/system/node/node1")).unwrap();
        assert!(
            cpu_numa(&sys, &[0, 1]).is_empty(),
            "one node is no topology"
        );
    }

    #[test]
    fn kernel_lists_and_addresses_parse_strictly() {
        assert_eq!(parse_cpu_list("0-2,8, 10-11"), [0, 1, 2, 8, 10, 11]);
        assert_eq!(parse_cpu_list("3-1,x,0-4294967295"), Vec::<u32>::new());
        assert_eq!(
            pci_address("00000000:3B:00.0").as_deref(),
            Some("0000:3b:00.0")
        );
        assert_eq!(pci_address("0000:3b:00.0").as_deref(), Some("0000:3b:00.0"));
        for bad in [
            "",
            "3b:00.0",
            "0000:3b:00",
            "zzzz:3b:00.0",
            "0000:3b:0.0",
            "1ffff:00:00.0",
        ] {
            assert_eq!(pci_address(bad), None, "{bad:?}");
        }
        assert_eq!(
            mig_profile("NVIDIA H100 80GB HBM3 MIG 1g.10gb").as_deref(),
            Some("1g.10gb")
        );
        assert_eq!(mig_profile("NVIDIA H100 80GB HBM3"), None);
    }
}
