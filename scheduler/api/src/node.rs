//! Nodes: what an agent reports about its machine, and the controller's view of it.

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

/// One GPU as the agent discovered it. Its `index` (the device minor) is the id the scheduler
/// allocates, the device node a job is given and the number accounting records; NVML's own
/// index and the UUID name the same GPU to NVML, CDI specs and container runtimes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Device minor: the N of `/dev/nvidiaN`.
    pub index: u32,
    /// Model name, when known.
    pub model: Option<String>,
    /// The GPU's UUID (`GPU-...`), when NVML or the driver reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Total GPU memory in bytes, when NVML reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// NVML's index for it (the order `nvidia-smi` lists GPUs in), when NVML is loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_index: Option<u32>,
    /// PCI address, lower case in the kernel's form (`0000:3b:00.0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus: Option<String>,
    /// NUMA node the GPU is attached to, when the machine has more than one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// The PCI bridge above the GPU's own port (a PCIe switch's upstream port on machines
    /// that have them): GPUs sharing it talk peer to peer without crossing the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<String>,
    /// MIG instances, when MIG mode is on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigInfo>,
}

impl GpuInfo {
    /// A GPU known only by its device node.
    pub fn minor(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            ..GpuInfo::default()
        }
    }

    /// The type name jobs ask for (`--gpus h100:2`), from the model name:
    /// "NVIDIA H100 80GB HBM3" is `h100`, "NVIDIA A100-SXM4-80GB" is `a100`; empty when
    /// the model is unknown.
    pub fn kind(&self) -> String {
        gpu_kind(self.model.as_deref().unwrap_or(""))
    }

    /// What jobs can be given of it: each MIG instance when it has any, else itself whole.
    pub fn units(&self) -> Vec<GpuUnit> {
        if self.mig.is_empty() {
            return vec![GpuUnit {
                id: self.index,
                kind: self.kind(),
                gpu: self.clone(),
                mig: None,
            }];
        }
        self.mig
            .iter()
            .enumerate()
            .map(|(slot, m)| GpuUnit {
                id: mig_unit_id(self.index, slot),
                kind: m.profile.to_ascii_lowercase(),
                gpu: self.clone(),
                mig: Some(m.clone()),
            })
            .collect()
    }
}

/// The unit of `gpus` with id `id` ([`GpuInfo::units`]).
pub fn gpu_unit(gpus: &[GpuInfo], id: u32) -> Option<GpuUnit> {
    let parent = mig_slot(id).map_or(id, |(p, _)| p);
    gpus.iter()
        .find(|g| g.index == parent)?
        .units()
        .into_iter()
        .find(|u| u.id == id)
}

/// The type name in a GPU model name: the first word with a digit, after the vendor and
/// brand words, up to its first `-`, lower case.
pub fn gpu_kind(model: &str) -> String {
    model
        .to_ascii_lowercase()
        .split_whitespace()
        .filter(|w| !matches!(*w, "nvidia" | "tesla" | "geforce" | "quadro"))
        .find(|w| w.chars().any(|c| c.is_ascii_digit()))
        .map(|w| w.split('-').next().unwrap_or(w).to_string())
        .unwrap_or_default()
}

/// One MIG instance of a GPU, as NVML lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigInfo {
    /// Its UUID (`MIG-...`).
    pub uuid: String,
    /// Its profile (`1g.10gb`), from the name NVML gives it.
    pub profile: String,
    /// Memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// The minors of the capability devices that open it (`/dev/nvidia-caps/nvidia-capN`:
    /// its GPU instance's and its compute instance's `access`), as the driver lists them
    /// under `/proc/driver/nvidia/capabilities`; empty when unknown (it cannot be used).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caps: Vec<u32>,
}

/// The first id of MIG instances: a GPU is scheduled by its device minor (below 256, the
/// driver's limit), MIG instance `slot` of the GPU of minor `parent` by
/// `MIG_ID_BASE + parent * 256 + slot`, so that no id of a node means two things.
pub const MIG_ID_BASE: u32 = 1 << 16;

/// The id MIG instance `slot` (its position in [`GpuInfo::mig`]) of GPU `parent` is
/// scheduled by.
pub fn mig_unit_id(parent: u32, slot: usize) -> u32 {
    MIG_ID_BASE + parent * 256 + slot as u32
}

/// The GPU (its minor) and MIG slot an id of [`mig_unit_id`] stands for; `None` for a whole
/// GPU's id.
pub fn mig_slot(id: u32) -> Option<(u32, usize)> {
    let rest = id.checked_sub(MIG_ID_BASE)?;
    Some((rest / 256, (rest % 256) as usize))
}

/// One GPU unit a job can be given: a whole GPU, or one MIG instance of a GPU in MIG mode
/// (whose GPU is then never given whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuUnit {
    /// The id it is scheduled by: the GPU's minor, or [`mig_unit_id`].
    pub id: u32,
    /// Its type: the GPU's ([`GpuInfo::kind`]) or the MIG profile (`1g.10gb`).
    pub kind: String,
    /// The GPU (the whole one, or the MIG instance's parent).
    pub gpu: GpuInfo,
    /// The MIG instance, for one.
    pub mig: Option<MigInfo>,
}

/// What an agent reports about its node when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Node name (the host name unless configured).
    pub name: String,
    /// Address other nodes and clients may use to reach it.
    pub address: String,
    /// Its address on the fabric jobs talk over (`[agent] fabric_interface`), when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_address: Option<String>,
    /// Logical CPUs usable by jobs.
    pub cpus: u32,
    /// Memory usable by jobs, bytes.
    pub memory: u64,
    /// GPUs found.
    pub gpus: Vec<GpuInfo>,
    /// NUMA node of each job CPU index (empty on machines with one NUMA node or where the
    /// kernel does not say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_numa: Vec<u32>,
    /// Agent version.
    pub version: String,
    /// Features the node's admin gave it (`[agent] features`), for `--constraint`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

impl NodeInfo {
    /// A node `name` reached at `address` with these CPUs, memory and GPUs, and nothing else
    /// described (no features, NUMA or fabric address).
    pub fn new(name: &str, address: &str, cpus: u32, memory: u64, gpus: Vec<GpuInfo>) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            address: address.into(),
            fabric_address: None,
            cpus,
            memory,
            gpus,
            cpu_numa: vec![],
            version: env!("CARGO_PKG_VERSION").into(),
            features: vec![],
        }
    }

    /// Total resources the node offers.
    pub fn capacity(&self) -> Resources {
        Resources {
            cpus: self.cpus,
            memory: self.memory,
            gpus: self.gpus.iter().map(|g| g.units().len() as u32).sum(),
        }
    }
}

/// Whether a node takes work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum NodeState {
    /// Heartbeating and schedulable.
    Up,
    /// Silent for longer than the node timeout.
    Down,
    /// Heartbeating, keeps its running jobs, takes no new ones: a launch found the node at
    /// fault, or an admin drained it (`wharf nodes --drain`); `reason` says why.
    Drain,
}

impl NodeState {
    /// Upper-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "UP",
            NodeState::Down => "DOWN",
            NodeState::Drain => "DRAIN",
        }
    }
}

/// The controller's record of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// As reported.
    pub info: NodeInfo,
    /// Up or down.
    pub state: NodeState,
    /// Last heartbeat, ms since the Unix epoch.
    pub last_seen: u64,
    /// Resources held by jobs now.
    pub allocated: Resources,
    /// Jobs on the node now.
    pub jobs: u32,
    /// Images in the node's store.
    #[serde(default)]
    pub images: Vec<String>,
    /// Why it is drained (as Slurm's `Reason=`), with who or what drained it; a drained node
    /// that is down keeps its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was drained, ms since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_since: Option<u64>,
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_gpu_in_mig_mode_is_given_by_its_instances_only() {
        let mig = |uuid: &str, profile: &str| MigInfo {
            uuid: uuid.into(),
            profile: profile.into(),
            memory: None,
            caps: vec![],
        };
        let whole = GpuInfo {
            model: Some("NVIDIA H100 80GB HBM3".into()),
            ..GpuInfo::minor(0)
        };
        let split = GpuInfo {
            mig: vec![mig("MIG-a", "1g.10gb"), mig("MIG-b", "3g.40gb")],
            ..GpuInfo {
                index: 3,
                ..whole.clone()
            }
        };
        let units = whole.units();
        assert_eq!(
            (units.len(), units[0].id, units[0].kind.as_str()),
            (1, 0, "h100")
        );
        let units = split.units();
        let ids: Vec<(u32, &str)> = units.iter().map(|u| (u.id, u.kind.as_str())).collect();
        assert_eq!(
            ids,
            [
                (mig_unit_id(3, 0), "1g.10gb"),
                (mig_unit_id(3, 1), "3g.40gb")
            ]
        );
        assert!(
            units.iter().all(|u| u.id != 3),
            "the parent is not given whole"
        );
        assert_eq!(mig_slot(mig_unit_id(3, 1)), Some((3, 1)));
        assert_eq!(mig_slot(255), None);
        let gpus = [whole, split];
        let b = gpu_unit(&gpus, mig_unit_id(3, 1)).unwrap();
        assert_eq!((b.gpu.index, b.mig.unwrap().uuid.as_str()), (3, "MIG-b"));
        assert_eq!(gpu_unit(&gpus, 0).unwrap().mig, None);
        assert_eq!(
            gpu_unit(&gpus, 3),
            None,
            "a GPU in MIG mode has no whole unit"
        );
        let node = NodeInfo::new("n", "n", 4, 1 << 30, gpus.to_vec());
        assert_eq!(node.capacity().gpus, 3);
    }

    use super::*;

    #[test]
    fn gpu_types_are_read_from_the_model_name() {
        assert_eq!(gpu_kind("NVIDIA H100 80GB HBM3"), "h100");
        assert_eq!(gpu_kind("NVIDIA A100-SXM4-80GB"), "a100");
        assert_eq!(gpu_kind("Tesla V100-PCIE-32GB"), "v100");
        assert_eq!(gpu_kind("NVIDIA GeForce RTX 4090"), "4090");
        assert_eq!(GpuInfo::minor(0).kind(), "");
    }
}
