//! Placement: which node a job goes to and which CPUs and GPUs on it.

use std::collections::BTreeSet;

use wharf_api::Resources;

/// A node as the scheduler sees it: capacity and what is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// Whether it takes work.
    pub up: bool,
    /// Total resources.
    pub capacity: Resources,
    /// CPU indices in use.
    pub used_cpus: BTreeSet<u32>,
    /// GPU indices in use.
    pub used_gpus: BTreeSet<u32>,
    /// Memory in use, bytes.
    pub used_memory: u64,
}

impl NodeView {
    /// An empty, up node.
    pub fn new(name: &str, capacity: Resources) -> NodeView {
        NodeView {
            name: name.into(),
            up: true,
            capacity,
            used_cpus: BTreeSet::new(),
            used_gpus: BTreeSet::new(),
            used_memory: 0,
        }
    }

    /// Marks resources of a running job as taken. Indices out of range are ignored (a node that
    /// re-registered smaller).
    pub fn hold(&mut self, cpu_ids: &[u32], gpu_ids: &[u32], memory: u64) {
        self.used_cpus
            .extend(cpu_ids.iter().filter(|&&c| c < self.capacity.cpus));
        self.used_gpus
            .extend(gpu_ids.iter().filter(|&&g| g < self.capacity.gpus));
        self.used_memory = self.used_memory.saturating_add(memory);
    }

    /// What is free now.
    pub fn free(&self) -> Resources {
        Resources {
            cpus: self
                .capacity
                .cpus
                .saturating_sub(self.used_cpus.len() as u32),
            memory: self.capacity.memory.saturating_sub(self.used_memory),
            gpus: self
                .capacity
                .gpus
                .saturating_sub(self.used_gpus.len() as u32),
        }
    }

    /// Takes the lowest free CPU and GPU indices for `need`. Call only when `need` fits.
    pub(crate) fn allocate(&mut self, need: &Resources) -> (Vec<u32>, Vec<u32>) {
        let cpus: Vec<u32> = (0..self.capacity.cpus)
            .filter(|c| !self.used_cpus.contains(c))
            .take(need.cpus as usize)
            .collect();
        let gpus: Vec<u32> = (0..self.capacity.gpus)
            .filter(|g| !self.used_gpus.contains(g))
            .take(need.gpus as usize)
            .collect();
        self.hold(&cpus, &gpus, need.memory);
        (cpus, gpus)
    }
}

/// The up node where `need` fits leaving the fewest CPUs free (then the fewest GPUs, then by
/// name), so large holes stay open for large jobs.
pub(crate) fn best_fit(nodes: &[NodeView], need: &Resources) -> Option<usize> {
    nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.up && need.fits_in(&n.free()))
        .min_by(|(_, a), (_, b)| {
            let (fa, fb) = (a.free(), b.free());
            (fa.gpus, fa.cpus, &a.name).cmp(&(fb.gpus, fb.cpus, &b.name))
        })
        .map(|(i, _)| i)
}
