//! Trackable resources (TRES): what a node offers and what a job asks of each node.
//!
//! GPUs have a type (`h100`, `a100`, ...). A node keeps at most [`GPU_SLOTS`] distinct types;
//! counts are kept per slot so that a time profile of a node is a small `Copy` value.

/// How many distinct GPU types one node may carry; GPUs of further types are not scheduled.
pub const GPU_SLOTS: usize = 4;

/// One GPU as the node's agent reports it: its own id (the N of `/dev/nvidiaN`), its type
/// and where it sits (NUMA node, PCIe switch), so that a job's GPUs are taken close together
/// and its CPUs next to them.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Gpu {
    /// The node's own id for it; never a position.
    pub id: u32,
    /// Type, lower case (`h100`); empty when unknown.
    pub kind: String,
    /// NUMA node it is attached to, when known.
    pub numa: Option<u32>,
    /// The PCIe switch it is behind (any number naming the switch on its node), when known.
    pub switch: Option<u32>,
}

impl Gpu {
    /// A GPU with this id and type (the type is lower-cased), place unknown.
    pub fn new(id: u32, kind: &str) -> Gpu {
        Gpu {
            id,
            kind: kind.to_ascii_lowercase(),
            numa: None,
            switch: None,
        }
    }

    /// The same GPU, attached to NUMA node `numa` behind PCIe switch `switch`.
    pub fn at(self, numa: Option<u32>, switch: Option<u32>) -> Gpu {
        Gpu {
            numa,
            switch,
            ..self
        }
    }
}

/// What a job needs on each of its nodes.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Request {
    /// Number of nodes (at least 1).
    pub nodes: u32,
    /// CPUs per node.
    pub cpus: u32,
    /// Memory per node, bytes.
    pub memory: u64,
    /// GPUs per node.
    pub gpus: u32,
    /// GPU type (`h100` in `--gpus h100:2`), lower case; `None` takes any type.
    pub gpu_kind: Option<String>,
    /// It takes all the memory of each of its nodes (Slurm's `--mem=0`), whatever each
    /// holds; `memory` is then only the least it needs.
    pub whole_memory: bool,
}

impl Request {
    /// A one-node request without a GPU type.
    pub fn per_node(cpus: u32, memory: u64, gpus: u32) -> Request {
        Request {
            nodes: 1,
            cpus,
            memory,
            gpus,
            gpu_kind: None,
            whole_memory: false,
        }
    }

    /// `nodes` (0 is taken as 1).
    pub fn node_count(&self) -> u32 {
        self.nodes.max(1)
    }
}

/// Amounts of each resource on one node, GPUs counted per type slot of that node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct Tres {
    pub cpus: u32,
    pub memory: u64,
    pub gpus: [u32; GPU_SLOTS],
}

impl Tres {
    pub fn gpu_total(&self) -> u32 {
        self.gpus.iter().sum()
    }

    /// `self` covers `need` on every axis.
    pub fn covers(&self, need: &Tres) -> bool {
        self.cpus >= need.cpus
            && self.memory >= need.memory
            && self.gpus.iter().zip(need.gpus.iter()).all(|(a, b)| a >= b)
    }

    pub fn add(&mut self, other: &Tres) {
        self.cpus = self.cpus.saturating_add(other.cpus);
        self.memory = self.memory.saturating_add(other.memory);
        for (a, b) in self.gpus.iter_mut().zip(other.gpus.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    pub fn sub(&mut self, other: &Tres) {
        self.cpus = self.cpus.saturating_sub(other.cpus);
        self.memory = self.memory.saturating_sub(other.memory);
        for (a, b) in self.gpus.iter_mut().zip(other.gpus.iter()) {
            *a = a.saturating_sub(*b);
        }
    }
}
