//! Nodes: what an agent reports about its machine, and the controller's view of it.

use serde::{Deserialize, Serialize};

use crate::resources::Resources;

/// One GPU as the agent discovered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// Index (the N of `/dev/nvidiaN`).
    pub index: u32,
    /// Model name, when known.
    pub model: Option<String>,
    /// The GPU's UUID (`GPU-...`), when NVML reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Total GPU memory in bytes, when NVML reports it.
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
    /// Logical CPUs usable by jobs.
    pub cpus: u32,
    /// Memory usable by jobs, bytes.
    pub memory: u64,
    /// GPUs found.
    pub gpus: Vec<GpuInfo>,
    /// Agent version.
    pub version: String,
    /// Features the node's admin gave it (`[agent] features`), for `--constraint`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

impl NodeInfo {
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
}

impl NodeState {
    /// Upper-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Up => "UP",
            NodeState::Down => "DOWN",
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
}
