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
            gpus: self.gpus.len() as u32,
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
