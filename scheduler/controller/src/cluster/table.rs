//! The active jobs, with the counts that requests need kept in step with every change, so
//! that no request has to walk the whole queue: each user's pending jobs (checked at every
//! submit against `[limits] max_pending_per_user`), each user's pending and running jobs
//! (counted at submit against MaxSubmitJobs limits), the jobs holding resources on each
//! node and the requeued jobs waiting for a node to let go of their last run (both read at
//! every agent poll).
//!
//! Every change goes through [`Jobs::insert`], [`Jobs::remove`] or [`Jobs::edit`], which
//! move the counts with it; there is no other way to reach a record mutably.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeBounds;

use wharf_api::{JobId, JobRecord, JobState};

/// Active jobs by id, with their counts.
#[derive(Debug, Default)]
pub(super) struct Jobs {
    map: BTreeMap<JobId, JobRecord>,
    /// Pending jobs (array tasks count one each) per uid; no entry for none.
    pending: BTreeMap<u32, u32>,
    /// Pending jobs and jobs holding resources, per uid.
    active_of: BTreeMap<u32, BTreeSet<JobId>>,
    /// Jobs holding resources, per node (a gang job under each of its nodes).
    on_node: BTreeMap<String, BTreeSet<JobId>>,
    /// Requeued jobs waiting for a node to let go of their last run, per node.
    requeued_from: BTreeMap<String, BTreeSet<JobId>>,
}

/// What of a record the counts depend on.
#[derive(PartialEq, Eq)]
struct Key {
    pending_of: Option<u32>,
    active_of: Option<u32>,
    holds_on: Vec<String>,
    requeued_from: Vec<String>,
}

impl std::ops::Index<&JobId> for Jobs {
    type Output = JobRecord;

    fn index(&self, id: &JobId) -> &JobRecord {
        &self.map[id]
    }
}

fn key(job: &JobRecord) -> Key {
    Key {
        pending_of: (job.state == JobState::Pending).then_some(job.owner.uid),
        active_of: (job.state == JobState::Pending || job.state.holds_resources())
            .then_some(job.owner.uid),
        holds_on: if job.state.holds_resources() {
            job.nodes().map(str::to_string).collect()
        } else {
            vec![]
        },
        requeued_from: job.requeued_from.clone(),
    }
}

impl Jobs {
    /// The jobs of `records`, counted.
    pub fn new(records: impl IntoIterator<Item = JobRecord>) -> Jobs {
        let mut jobs = Jobs::default();
        for r in records {
            jobs.insert(r);
        }
        jobs
    }

    /// Adds or replaces a job.
    pub fn insert(&mut self, job: JobRecord) {
        let (id, new) = (job.id, key(&job));
        if let Some(old) = self.map.insert(id, job) {
            self.uncount(id, &key(&old));
        }
        self.count(id, &new);
    }

    /// Removes a job.
    pub fn remove(&mut self, id: JobId) -> Option<JobRecord> {
        let job = self.map.remove(&id)?;
        self.uncount(id, &key(&job));
        Some(job)
    }

    /// Changes a job in place; the counts follow whatever `change` does to it.
    pub fn edit<R>(&mut self, id: JobId, change: impl FnOnce(&mut JobRecord) -> R) -> Option<R> {
        let job = self.map.get_mut(&id)?;
        let before = key(job);
        let out = change(job);
        let after = key(job);
        if before != after {
            self.uncount(id, &before);
            self.count(id, &after);
        }
        Some(out)
    }

    /// The job `id`.
    pub fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.map.get(id)
    }

    /// Whether `id` is active.
    pub fn contains_key(&self, id: &JobId) -> bool {
        self.map.contains_key(id)
    }

    /// Every active job, in id order.
    pub fn values(&self) -> impl Iterator<Item = &JobRecord> + '_ {
        self.map.values()
    }

    /// The active jobs with ids in `range`, in id order.
    pub fn range(&self, range: impl RangeBounds<JobId>) -> impl Iterator<Item = &JobRecord> + '_ {
        self.map.range(range).map(|(_, j)| j)
    }

    /// Active jobs.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// No active job.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The active jobs' ids, in order.
    #[cfg(test)]
    pub fn keys(&self) -> impl Iterator<Item = &JobId> + '_ {
        self.map.keys()
    }

    /// How many pending jobs `uid` has.
    pub fn pending_of(&self, uid: u32) -> u32 {
        self.pending.get(&uid).copied().unwrap_or(0)
    }

    /// The pending jobs and the jobs holding resources of `uid`, in id order.
    pub fn active_of(&self, uid: u32) -> impl Iterator<Item = &JobRecord> + '_ {
        self.active_of
            .get(&uid)
            .into_iter()
            .flatten()
            .filter_map(|id| self.map.get(id))
    }

    /// The jobs holding resources on `node`, in id order.
    pub fn on_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a JobRecord> + 'a {
        self.on_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|id| self.map.get(id))
    }

    /// Requeued jobs waiting for `node` to let go of their last run, in id order.
    pub fn requeued_from<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a JobRecord> + 'a {
        self.requeued_from
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|id| self.map.get(id))
    }

    fn count(&mut self, id: JobId, k: &Key) {
        if let Some(uid) = k.pending_of {
            *self.pending.entry(uid).or_default() += 1;
        }
        if let Some(uid) = k.active_of {
            self.active_of.entry(uid).or_default().insert(id);
        }
        for node in &k.holds_on {
            self.on_node.entry(node.clone()).or_default().insert(id);
        }
        for node in &k.requeued_from {
            self.requeued_from
                .entry(node.clone())
                .or_default()
                .insert(id);
        }
    }

    fn uncount(&mut self, id: JobId, k: &Key) {
        if let Some(uid) = k.pending_of {
            if let Some(n) = self.pending.get_mut(&uid) {
                *n -= 1;
                if *n == 0 {
                    self.pending.remove(&uid);
                }
            }
        }
        if let Some(uid) = k.active_of {
            forget(&mut self.active_of, &uid, id);
        }
        for node in &k.holds_on {
            forget(&mut self.on_node, node, id);
        }
        for node in &k.requeued_from {
            forget(&mut self.requeued_from, node, id);
        }
    }
}

/// Takes `id` out of the set at `key`, and the set out of `index` once empty.
fn forget<K: Ord + ?Sized, Q: Ord + std::borrow::Borrow<K>>(
    index: &mut BTreeMap<Q, BTreeSet<JobId>>,
    key: &K,
    id: JobId,
) {
    if let Some(set) = index.get_mut(key) {
        set.remove(&id);
        if set.is_empty() {
            index.remove(key);
        }
    }
}
