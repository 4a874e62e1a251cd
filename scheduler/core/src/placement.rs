//! Placement: the nodes of a pass with their free ids, an index of free capacity per
//! partition, and the choice of nodes and ids for a job.
//!
//! Ids always come from the node's own lists (a node whose GPUs are 0, 1 and 3 is never given
//! GPU 2); counts are kept per GPU type slot so that time profiles stay small.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::JobId;

use crate::partition::{takes_work, Partitions};
use crate::profile::Profile;
use crate::state::{Alloc, Node, RunningJob, Time};
use crate::topology::Topology;
use crate::tres::{Request, Tres, GPU_SLOTS};

/// A node during a pass.
#[derive(Debug, Clone)]
pub(crate) struct NodeRt {
    pub up: bool,
    pub capacity: Tres,
    /// GPU type of each slot.
    pub kinds: Vec<String>,
    /// Free CPU ids, ascending.
    pub free_cpus: Vec<u32>,
    /// Free GPU ids per slot, ascending.
    pub free_gpus: [Vec<u32>; GPU_SLOTS],
    pub profile: Profile,
    /// Partitions it is in.
    pub parts: Vec<usize>,
    /// The running jobs on it, in the order given.
    pub jobs: Vec<Holding>,
    /// Where its GPUs and CPUs sit, when its agent said.
    pub topology: Option<Box<Topology>>,
}

/// What placement needs to know of one job: its request per node, the nodes it may use and
/// whether it takes them whole.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fit<'a> {
    pub req: &'a Request,
    /// By node index; `None`: every node.
    pub allowed: Option<&'a [bool]>,
    pub exclusive: bool,
}

impl Fit<'_> {
    /// True when the job may use node `i`.
    pub fn may_use(&self, i: usize) -> bool {
        self.allowed.is_none_or(|a| a[i])
    }
}

/// What one running job holds on one node, and when the profile has it given back. A node's
/// holdings are kept in job id order, however they were added.
#[derive(Debug, Clone)]
pub(crate) struct Holding {
    pub id: JobId,
    pub tres: Tres,
    /// Its release time in the node's profile.
    pub end: Time,
    /// A stop was sent to it (before or during this pass): it comes back at once.
    pub stopping: bool,
}

/// The shapes a request may take on one node, at most one per GPU type slot: kept inline,
/// since every node a job is tried on asks for them.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Shapes {
    items: [Tres; GPU_SLOTS],
    len: usize,
}

impl Shapes {
    fn push(&mut self, t: Tres) {
        self.items[self.len] = t;
        self.len += 1;
    }
}

impl std::ops::Deref for Shapes {
    type Target = [Tres];
    fn deref(&self) -> &[Tres] {
        &self.items[..self.len]
    }
}

impl IntoIterator for Shapes {
    type Item = Tres;
    type IntoIter = std::iter::Take<std::array::IntoIter<Tres, GPU_SLOTS>>;
    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter().take(self.len)
    }
}

/// Index key: free GPUs, free CPUs, node index. Ascending order is best fit first.
type Key = (u32, u32, usize);

/// The ids one running job took on one node, so that they can be given back exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    pub node: usize,
    cpus: Vec<u32>,
    /// GPU ids with their type slot.
    gpus: Vec<(usize, u32)>,
    tres: Tres,
}

/// All nodes of a pass and the free-capacity index of each partition.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub nodes: Vec<NodeRt>,
    index: Vec<BTreeSet<Key>>,
    /// Nodes of each partition grouped by shape: (a node of the group, how many, how many
    /// up). Clusters have few node shapes, so "could this job ever run here" looks at a
    /// handful; shapes and states only change with the nodes, so they are grouped once.
    pub classes: Vec<Vec<(usize, usize, usize)>>,
    /// While a pass runs on a kept table: each node it changed, as it was before.
    saved: Option<Saved>,
}

/// The nodes a pass changed, as they were before it.
#[derive(Debug, Clone, Default)]
struct Saved {
    /// By node index: saved already.
    marked: Vec<bool>,
    nodes: Vec<(usize, NodeRt)>,
}

impl Table {
    /// Builds the table from the nodes and what running jobs hold. Running jobs are expected
    /// to give their resources back at `start + time_limit`, or just after `now` when late
    /// or `stopping`.
    pub fn build(
        nodes: &[Node],
        running: &[RunningJob],
        stopping: &BTreeSet<JobId>,
        parts: &Partitions,
        now: Time,
    ) -> Table {
        let mut table = Table::empty(nodes, parts);
        let by_name: BTreeMap<&str, usize> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        // In id order, as a kept table adds them (see `crate::incremental`).
        let mut order: Vec<&RunningJob> = running.iter().collect();
        order.sort_by_key(|j| j.id);
        for job in order {
            let stops = stopping.contains(&job.id);
            let end = release_time(job, stops, now);
            for a in &job.allocs {
                if let Some(&i) = by_name.get(a.node.as_str()) {
                    table.hold(i, job.id, a, end, stops);
                }
            }
        }
        table
    }

    /// The nodes with nothing running on them.
    pub fn empty(nodes: &[Node], parts: &Partitions) -> Table {
        let mut rt: Vec<NodeRt> = nodes.iter().map(node_rt).collect();
        for (p, part) in parts.parts.iter().enumerate() {
            for &i in &part.nodes {
                rt[i].parts.push(p);
            }
        }
        let mut index = vec![BTreeSet::new(); parts.parts.len()];
        for (i, n) in rt.iter().enumerate() {
            if n.up {
                for &p in &n.parts {
                    index[p].insert(key(n, i));
                }
            }
        }
        let classes = parts
            .parts
            .iter()
            .map(|part| {
                let mut groups: BTreeMap<(Tres, &[String]), (usize, usize, usize)> =
                    BTreeMap::new();
                for &i in &part.nodes {
                    let n = &rt[i];
                    let g = groups.entry((n.capacity, &n.kinds)).or_insert((i, 0, 0));
                    g.1 += 1;
                    g.2 += usize::from(n.up);
                }
                groups.into_values().collect()
            })
            .collect();
        Table {
            nodes: rt,
            index,
            classes,
            saved: None,
        }
    }

    /// Job `id` holds what `a` names on node `i` until `end`: the ids it names that are free
    /// are taken (an id that is not free is not taken twice), and its memory as far as the
    /// node has it.
    pub fn hold(&mut self, i: usize, id: JobId, a: &Alloc, end: Time, stopping: bool) -> Taken {
        let old = key(&self.nodes[i], i);
        let n = &mut self.nodes[i];
        let mut taken = Taken {
            node: i,
            cpus: Vec::with_capacity(a.cpu_ids.len()),
            gpus: Vec::with_capacity(a.gpu_ids.len()),
            tres: Tres::default(),
        };
        for id in &a.cpu_ids {
            if let Ok(pos) = n.free_cpus.binary_search(id) {
                n.free_cpus.remove(pos);
                taken.cpus.push(*id);
            }
        }
        for id in &a.gpu_ids {
            for (s, ids) in n.free_gpus.iter_mut().enumerate() {
                if let Ok(pos) = ids.binary_search(id) {
                    ids.remove(pos);
                    taken.gpus.push((s, *id));
                    taken.tres.gpus[s] += 1;
                }
            }
        }
        taken.tres.cpus = taken.cpus.len() as u32;
        taken.tres.memory = a.memory.min(n.profile.free.memory);
        n.profile.take(&taken.tres, end);
        let at = n.jobs.partition_point(|h| h.id < id);
        n.jobs.insert(
            at,
            Holding {
                id,
                tres: taken.tres,
                end,
                stopping,
            },
        );
        self.rekey(i, old);
        taken
    }

    /// Gives back what [`Table::hold`] took for job `id`, expected back at `end`.
    pub fn unhold(&mut self, id: JobId, taken: &Taken, end: Time) {
        let i = taken.node;
        let old = key(&self.nodes[i], i);
        let n = &mut self.nodes[i];
        for c in &taken.cpus {
            if let Err(pos) = n.free_cpus.binary_search(c) {
                n.free_cpus.insert(pos, *c);
            }
        }
        for &(s, g) in &taken.gpus {
            if let Err(pos) = n.free_gpus[s].binary_search(&g) {
                n.free_gpus[s].insert(pos, g);
            }
        }
        n.profile.give_back(&taken.tres, end);
        if let Ok(at) = n.jobs.binary_search_by_key(&id, |h| h.id) {
            n.jobs.remove(at);
        }
        self.rekey(i, old);
    }

    /// Moves job `id`'s release on node `i` from `from` to `to`, and marks it stopping or not.
    pub fn move_hold(&mut self, i: usize, id: JobId, from: Time, to: Time, stopping: bool) {
        let n = &mut self.nodes[i];
        if let Ok(at) = n.jobs.binary_search_by_key(&id, |h| h.id) {
            let h = &mut n.jobs[at];
            n.profile.move_release(&h.tres, from, to);
            h.end = to;
            h.stopping = stopping;
        }
    }

    /// After node `i` changed from index key `old`: files it under its new key.
    fn rekey(&mut self, i: usize, old: Key) {
        let new = key(&self.nodes[i], i);
        if new != old && self.nodes[i].up {
            for &p in &self.nodes[i].parts {
                self.index[p].remove(&old);
                self.index[p].insert(new);
            }
        }
    }

    /// Starts a pass on a table that outlives it: from now until [`Table::end_pass`], every
    /// node the pass changes is saved first.
    pub fn begin_pass(&mut self) {
        self.saved = Some(Saved {
            marked: vec![false; self.nodes.len()],
            nodes: Vec::new(),
        });
    }

    /// Puts back every node the pass changed, as it was at [`Table::begin_pass`].
    pub fn end_pass(&mut self) {
        for (i, before) in self.saved.take().unwrap_or_default().nodes {
            let old = key(&self.nodes[i], i);
            self.nodes[i] = before;
            self.rekey(i, old);
        }
    }

    /// Node `i`, to be changed by the pass.
    pub fn node_mut(&mut self, i: usize) -> &mut NodeRt {
        if let Some(saved) = &mut self.saved {
            if !saved.marked[i] {
                saved.marked[i] = true;
                saved.nodes.push((i, self.nodes[i].clone()));
            }
        }
        &mut self.nodes[i]
    }

    /// What `req` needs on node `i` if its GPUs come from `slot`.
    fn need(&self, i: usize, req: &Request, slot: Option<usize>) -> Tres {
        let memory = if req.whole_memory {
            self.nodes[i].capacity.memory.max(req.memory)
        } else {
            req.memory
        };
        let mut t = Tres {
            cpus: req.cpus,
            memory,
            gpus: [0; GPU_SLOTS],
        };
        if let Some(s) = slot {
            t.gpus[s] = req.gpus;
        }
        t
    }

    /// The shapes `req` may take on node `i`: one per usable GPU type slot, most free first.
    /// A job that takes whole nodes (`exclusive`) has one shape, the node's capacity, on a node
    /// that could hold its request at all.
    pub fn shapes(&self, i: usize, req: &Request, exclusive: bool) -> Shapes {
        let n = &self.nodes[i];
        let mut out = Shapes::default();
        if exclusive {
            let fits = self
                .shapes(i, req, false)
                .iter()
                .any(|need| n.capacity.covers(need));
            if fits {
                out.push(n.capacity);
            }
            return out;
        }
        if req.gpus == 0 {
            out.push(self.need(i, req, None));
            return out;
        }
        let mut slots = [0usize; GPU_SLOTS];
        let mut count = 0;
        for s in 0..n.kinds.len().min(GPU_SLOTS) {
            if req.gpu_kind.as_deref().is_none_or(|k| n.kinds[s] == k) {
                slots[count] = s;
                count += 1;
            }
        }
        let slots = &mut slots[..count];
        slots.sort_by_key(|&s| (std::cmp::Reverse(n.profile.free.gpus[s]), s));
        for &s in slots.iter() {
            out.push(self.need(i, req, Some(s)));
        }
        out
    }

    /// Up to `req.nodes` nodes of partition `p` that the job may use (`allowed`, by node
    /// index; `None`: all) where `req` can start now and run for `duration` without touching
    /// any reservation; best fit first. `None` if too few.
    pub fn fit_now(
        &self,
        p: usize,
        job: &Fit<'_>,
        now: Time,
        duration: Time,
    ) -> Option<Vec<(usize, Tres)>> {
        let req = job.req;
        let want = req.node_count() as usize;
        let end = now.saturating_add(duration);
        let mut picked = Vec::with_capacity(want);
        for &(_, cpus, i) in self.index[p].range((req.gpus, req.cpus, 0)..) {
            if cpus < req.cpus || self.nodes[i].profile.free.memory < req.memory || !job.may_use(i)
            {
                continue;
            }
            let prof = &self.nodes[i].profile;
            let shape = self.shapes(i, req, job.exclusive).into_iter().find(|need| {
                prof.free.covers(need) && (prof.reserved.is_empty() || prof.fits(need, now, end))
            });
            if let Some(need) = shape {
                picked.push((i, need));
                if picked.len() == want {
                    return Some(picked);
                }
            }
        }
        None
    }

    /// Takes ids for `need` on node `i` from now until `end`; returns them.
    pub fn allocate(&mut self, i: usize, need: &Tres, end: Time, name: &str) -> Alloc {
        let old = key(&self.nodes[i], i);
        let n = self.node_mut(i);
        let mut gpu_ids = Vec::new();
        for (s, &count) in need.gpus.iter().enumerate() {
            match &n.topology {
                Some(t) => gpu_ids.extend(t.take_gpus(&mut n.free_gpus[s], count as usize)),
                None => gpu_ids.extend(n.free_gpus[s].drain(..count as usize)),
            }
        }
        gpu_ids.sort_unstable();
        let cpu_ids: Vec<u32> = match &n.topology {
            Some(t) => {
                let near = t.numa_of_gpus(&gpu_ids);
                t.take_cpus(&mut n.free_cpus, need.cpus as usize, &near)
            }
            None => n.free_cpus.drain(..need.cpus as usize).collect(),
        };
        n.profile.take(need, end);
        self.rekey(i, old);
        Alloc {
            node: name.into(),
            cpu_ids,
            gpu_ids,
            memory: need.memory,
        }
    }
}

/// Puts a job's allocs in rank order: the order of its nodes in its compressed host list
/// (`SLURM_JOB_NODELIST`, [`wharf_api::hostlist::compress`]: by name prefix, then number, so
/// gpu2 before gpu10), not the best-fit order they were picked in. As in Slurm, rank 0 (and
/// `MASTER_ADDR`) is then on the list's first node and a node's rank is its place there.
pub(crate) fn in_rank_order(allocs: &mut [Alloc]) {
    if allocs.len() < 2 {
        return;
    }
    let names: Vec<&str> = allocs.iter().map(|a| a.node.as_str()).collect();
    let list = wharf_api::hostlist::HostList::from_names(&names);
    let place: BTreeMap<&str, usize> = list
        .names()
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    allocs.sort_by_cached_key(|a| place.get(a.node.as_str()).copied().unwrap_or(usize::MAX));
}

/// When a running job's resources are expected back: at the end of its time limit, or just
/// after `now` when it is late or being stopped.
pub(crate) fn release_time(job: &RunningJob, stopping: bool, now: Time) -> Time {
    if stopping {
        now + 1
    } else {
        job.start.saturating_add(job.time_limit).max(now + 1)
    }
}

fn key(n: &NodeRt, i: usize) -> Key {
    (n.profile.free.gpu_total(), n.profile.free.cpus, i)
}

fn node_rt(node: &Node) -> NodeRt {
    let mut cpus = node.cpu_ids.clone();
    cpus.sort_unstable();
    cpus.dedup();
    let mut gpus = node.gpus.clone();
    gpus.sort();
    gpus.dedup_by_key(|g| g.id);
    let mut kinds: Vec<String> = Vec::new();
    let mut free_gpus: [Vec<u32>; GPU_SLOTS] = Default::default();
    for g in &gpus {
        let slot = match kinds.iter().position(|k| *k == g.kind) {
            Some(s) => s,
            None if kinds.len() < GPU_SLOTS => {
                kinds.push(g.kind.clone());
                kinds.len() - 1
            }
            // More types than slots: those GPUs are not scheduled.
            None => continue,
        };
        free_gpus[slot].push(g.id);
    }
    for ids in &mut free_gpus {
        ids.sort_unstable();
    }
    let mut capacity = Tres {
        cpus: cpus.len() as u32,
        memory: node.memory,
        gpus: [0; GPU_SLOTS],
    };
    for (s, ids) in free_gpus.iter().enumerate() {
        capacity.gpus[s] = ids.len() as u32;
    }
    NodeRt {
        up: takes_work(node.state),
        capacity,
        kinds,
        free_cpus: cpus,
        free_gpus,
        profile: Profile::empty(capacity),
        parts: Vec::new(),
        jobs: Vec::new(),
        topology: Topology::of(node),
    }
}
