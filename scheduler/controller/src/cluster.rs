//! The controller's state machine: jobs and nodes in memory, mirrored to the store. Every
//! method that changes something commits it before returning, so an answer sent after it
//! returns is durable. Synchronous; the HTTP layer calls it under one lock.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::wire::{AgentJob, ErrorKind, NodeKeyEntry, NodeKeyList, PollRequest};
use wharf_api::PullProgress;
use wharf_api::{
    ExitInfo, JobDefaults, JobId, JobRecord, JobState, NodeInfo, NodeRecord, NodeState, Owner,
    Resources,
};
use wharf_core::{Config as SchedConfig, Scheduler, UsageLedger};

use crate::store::{ListFilter, Store, StoreError};
use crate::visibility::{ended_reason, view};
use crate::watch::JobWatch;

mod access;
pub mod acct;
mod admin;
mod array;
mod budget;
mod drain;
mod forms;
mod gang;
mod listing;
pub mod prepull;
mod requeue;
mod runs;
mod sched;
pub mod signal;
pub mod steps;
mod submit;
mod table;

/// A refused or failed request, with its kind and words for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Kind (maps to an HTTP status).
    pub kind: ErrorKind,
    /// What went wrong and what to do.
    pub message: String,
}

impl Failure {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::new(ErrorKind::Internal, e.to_string())
    }
}

/// Who is asking, as the kernel told us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The user.
    pub owner: Owner,
    /// May act on every job.
    pub admin: bool,
}

impl Caller {
    /// May see everything of `job` and cancel it: its owner or an admin.
    pub fn may_manage(&self, job: &JobRecord) -> bool {
        self.admin || job.owner.uid == self.owner.uid
    }
}

#[derive(Debug)]
struct NodeEntry {
    info: NodeInfo,
    images: BTreeSet<String>,
    last_seen: u64,
    up: bool,
    /// Drained: takes no new jobs.
    drain: Option<drain::Drain>,
    /// The newest report taken from its agent.
    last_poll: Option<wharf_api::wire::PollSeq>,
    /// Runs its agent last reported still going that hold nothing here as far as the
    /// controller knows (a node taken for lost that came back with them; it is told to kill
    /// them): until they are gone, what they use is in use, so the node takes no new job.
    leftover: BTreeSet<JobId>,
}

/// Jobs and nodes.
#[derive(Debug)]
pub struct Cluster {
    store: Store,
    /// Ended runs (`wharf acct`, `wharf report`).
    ledger: Box<dyn crate::ledger::Ledger>,
    /// The ledger is a table of `store`'s database: runs are written in the same transaction
    /// as their jobs' final states.
    ledger_in_store: bool,
    /// The ledger's engine name (`sqlite`, `postgres`).
    engine: String,
    /// Runs that ended in a requeue since the last commit (their jobs go on).
    requeued_runs: Vec<crate::ledger::JobRun>,
    jobs: table::Jobs,
    nodes: BTreeMap<String, NodeEntry>,
    defaults: JobDefaults,
    node_timeout_ms: u64,
    max_pending_per_user: u32,
    forms: crate::FormsConfig,
    /// The config file's associations merged with the database's (`wharf admin`).
    assocs: crate::admin::Registry,
    /// What the scheduler works with: the config file's policy and `assocs`.
    sched: SchedConfig,
    /// The scheduling core, which keeps its view of nodes and running jobs between passes.
    scheduler: Scheduler,
    /// The reservations of the last pass, in the order it made them, for the next pass (see
    /// `wharf_core::State::reserved`); not stored: after a restart the first pass makes them
    /// again.
    reserved: BTreeMap<JobId, wharf_core::KeptReservation>,
    /// How long the last pass took to decide, before committing what it decided (see
    /// [`Cluster::deciding`]).
    deciding: std::time::Duration,
    /// Fair-share usage: rebuilt at start from the ledger's most recent runs, then charged as
    /// runs end.
    usage: UsageLedger,
    /// What runs that ended in the current budget period used (account budgets).
    budgets: budget::Budgets,
    /// How a submitting user's Unix groups are found (partitions' AllowGroups).
    groups: crate::groups::GroupLookup,
    /// What `groups` found, by uid, kept a few seconds: it is asked under this cluster's
    /// lock, at each submit to a partition with AllowGroups.
    kept_groups: crate::kept::Kept<u32, Vec<String>>,
    /// Waiters on jobs' states, woken by every commit.
    watch: JobWatch,
    /// Users' registry credentials for their active jobs, apart from the records.
    credentials: crate::registry_auth::JobCredentials,
    /// Per STARTING job, its nodes' pulls of its image as their agents last reported them:
    /// in memory only (transient, never stored), dropped when the job leaves STARTING.
    pulls: BTreeMap<JobId, Vec<PullProgress>>,
    /// Admins' pre-pulls of images on nodes (memory only).
    prepulls: prepull::PrePulls,
    /// Per node, the newest signal its agent last reported passed on for each job it runs
    /// (memory only; see [`signal`]).
    signals_passed: BTreeMap<String, BTreeMap<JobId, u64>>,
}

impl Cluster {
    /// Loads active jobs and known nodes from the store, with the default scheduling policy.
    pub fn load(
        store: Store,
        defaults: JobDefaults,
        node_timeout_ms: u64,
        now: u64,
    ) -> Result<Cluster, StoreError> {
        Self::load_with_scheduler(
            store,
            defaults,
            node_timeout_ms,
            now,
            SchedConfig::default(),
        )
    }

    /// Loads active jobs and known nodes from the store, merges the config file's
    /// associations in `sched` with the store's (`crate::admin`) and charges its ended jobs to
    /// fair share under the result (read once, at start).
    pub fn load_with_scheduler(
        store: Store,
        defaults: JobDefaults,
        node_timeout_ms: u64,
        now: u64,
        sched: SchedConfig,
    ) -> Result<Cluster, StoreError> {
        Self::load_with_ledger(store, defaults, node_timeout_ms, now, sched, None)
    }

    /// [`Cluster::load_with_scheduler`] with its ledger: the SQLite table of the state
    /// database when `ledger` is `None`, else that one (PostgreSQL) under its engine name,
    /// which is filled from the jobs that ended before (once per engine) and which fair share
    /// is replayed from.
    pub fn load_with_ledger(
        store: Store,
        defaults: JobDefaults,
        node_timeout_ms: u64,
        now: u64,
        sched: SchedConfig,
        ledger: Option<(Box<dyn crate::ledger::Ledger>, &str)>,
    ) -> Result<Cluster, StoreError> {
        let jobs = table::Jobs::new(store.active_jobs()?);
        let mut drains: BTreeMap<String, drain::Drain> = store
            .drains()?
            .into_iter()
            .map(|(name, reason, since)| (name, drain::Drain { reason, since }))
            .collect();
        let state_dir = store.path().parent().unwrap_or(std::path::Path::new("."));
        let credentials = crate::registry_auth::JobCredentials::open(state_dir)
            .and_then(|c| c.retain(|id| jobs.contains_key(&id)).map(|()| c))
            .map_err(|e| {
                let dir = state_dir.join(crate::registry_auth::DIR);
                StoreError::Mode(dir.display().to_string(), e)
            })?;
        let nodes = store
            .nodes()?
            .into_iter()
            .map(|(info, seen)| {
                // Give every node a full timeout to reconnect after a controller restart.
                let entry = NodeEntry {
                    drain: drains.remove(&info.name),
                    info,
                    images: BTreeSet::new(),
                    last_seen: now.max(seen),
                    up: true,
                    last_poll: None,
                    leftover: BTreeSet::new(),
                };
                (entry.info.name.clone(), entry)
            })
            .collect();
        let assocs = crate::admin::Registry::load(sched, &store.association_rows()?)?;
        let sched = assocs.config();
        let (ledger, engine, ledger_in_store) = match ledger {
            Some((ledger, engine)) => (ledger, engine, false),
            None => {
                let sqlite = crate::ledger::sqlite::SqliteLedger::open(store.path())
                    .map_err(StoreError::Ledger)?;
                (
                    Box::new(sqlite) as Box<dyn crate::ledger::Ledger>,
                    "sqlite",
                    true,
                )
            }
        };
        let mut cluster = Cluster {
            store,
            ledger,
            engine: engine.to_string(),
            ledger_in_store,
            requeued_runs: Vec::new(),
            jobs,
            nodes,
            defaults,
            node_timeout_ms,
            max_pending_per_user: u32::MAX,
            forms: crate::FormsConfig::default(),
            assocs,
            usage: UsageLedger::new(sched.half_life),
            sched,
            scheduler: Scheduler::default(),
            reserved: BTreeMap::new(),
            deciding: std::time::Duration::ZERO,
            budgets: budget::Budgets::default(),
            groups: crate::groups::unix_groups,
            kept_groups: Default::default(),
            watch: JobWatch::default(),
            credentials,
            pulls: BTreeMap::new(),
            signals_passed: BTreeMap::new(),
            prepulls: prepull::PrePulls::default(),
        };
        cluster.fill_ledger(engine).map_err(StoreError::Ledger)?;
        if !cluster.ledger_in_store {
            if let Err(e) = cluster.reconcile_ledger() {
                tracing::error!(
                    error = %e,
                    "accounting: runs left in the outbox not recorded; tried again at the next start"
                );
            }
        }
        match cluster.ledger.dead_letters() {
            Ok(0) => {}
            Ok(n) => tracing::warn!(
                runs = n,
                "accounting: runs the database refused are set aside in ledger.deadletter \
                 (`wharf admin ledger`)"
            ),
            Err(e) => tracing::warn!(error = %e, "accounting: the dead letters cannot be read"),
        }
        cluster.replay_usage()?;
        Ok(cluster)
    }

    /// Sets the most jobs one user may have pending (`u32::MAX`: no limit).
    pub fn with_max_pending_per_user(mut self, max: u32) -> Cluster {
        self.max_pending_per_user = max;
        self
    }

    /// Sets how job forms behave (dependencies that can never be met, array sizes).
    pub fn with_forms(mut self, forms: crate::FormsConfig) -> Cluster {
        self.forms = forms;
        self
    }

    /// Sets how users' Unix groups are found (the system's group database by default).
    pub fn with_group_lookup(mut self, lookup: crate::groups::GroupLookup) -> Cluster {
        self.groups = lookup;
        self
    }

    /// Cancels a job: a pending job ends now; a started one gets a kill order on each of its
    /// nodes. Returns the job as the caller sees it after the request, and the nodes to wake.
    pub fn cancel(
        &mut self,
        caller: &Caller,
        id: JobId,
        now: u64,
    ) -> Result<(JobRecord, Vec<String>), Failure> {
        let Some(job) = self.jobs.get(&id) else {
            return match self.store.job(id)? {
                Some(j) if caller.may_manage(&j) => Err(Failure::new(
                    ErrorKind::Conflict,
                    format!("job {} has already ended ({})", j.label(), j.state),
                )),
                Some(_) => Err(not_yours(id)),
                None => Err(Failure::new(ErrorKind::NotFound, format!("no job {id}"))),
            };
        };
        if !caller.may_manage(job) {
            return Err(not_yours(id));
        }
        let mut job = job.clone();
        let wake = job.nodes().map(str::to_string).collect();
        if job.state == JobState::Pending {
            job.state = JobState::Cancelled;
            job.end_time = Some(now);
            job.reason = Some(format!("cancelled by {}", caller.owner.user));
        } else {
            job.cancel_requested = true;
            job.reason = Some(format!(
                "cancel requested by {}; stopping",
                caller.owner.user
            ));
        }
        self.commit(vec![job.clone()])?;
        Ok((view(caller, job), wake))
    }

    /// A job as `caller` may see it (private fields hidden from other users).
    pub fn job(&self, caller: &Caller, id: JobId) -> Result<JobRecord, Failure> {
        let job = match self.jobs.get(&id) {
            Some(j) => j.clone(),
            None => self
                .store
                .job(id)?
                .ok_or_else(|| Failure::new(ErrorKind::NotFound, format!("no job {id}")))?,
        };
        Ok(view(caller, self.with_pulls(job)))
    }

    /// `job` with its nodes' image pulls under way, if any.
    fn with_pulls(&self, mut job: JobRecord) -> JobRecord {
        if let Some(pulls) = self.pulls.get(&job.id) {
            job.pulling = pulls.clone();
        }
        job
    }

    /// Takes in the pulls `node` reports: they replace the node's earlier ones. Kept only
    /// for STARTING jobs with a rank on the node that has not started; none of a report of
    /// more than [`PullProgress::MAX_PER_POLL`].
    fn take_pulls(&mut self, node: &str, reported: &[PullProgress]) {
        for pulls in self.pulls.values_mut() {
            pulls.retain(|p| p.node != node);
        }
        let reported = if reported.len() > PullProgress::MAX_PER_POLL {
            tracing::warn!(
                node,
                pulls = reported.len(),
                "a node reported too many pulls; none kept"
            );
            &[]
        } else {
            reported
        };
        for p in reported {
            let starting = self
                .jobs
                .get(&p.job)
                .filter(|j| j.state == JobState::Starting)
                .and_then(|j| j.allocs.get(j.rank_on(node)? as usize))
                .is_some_and(|a| a.start_time.is_none() && !a.ended());
            if !starting {
                continue;
            }
            let mut p = p.clone();
            p.node = node.to_string();
            p.image = wharf_api::text::bounded(&p.image, PullProgress::MAX_IMAGE_LEN).into_owned();
            self.pulls.entry(p.job).or_default().push(p);
        }
        self.pulls.retain(|_, pulls| !pulls.is_empty());
    }

    /// Job `id` as `caller` may see it and, while it is active, a receiver of its state that
    /// every later commit of the job updates (`GET /v1/jobs/{id}/wait`).
    pub fn watch_job(
        &mut self,
        caller: &Caller,
        id: JobId,
    ) -> Result<
        (
            JobRecord,
            Option<tokio::sync::watch::Receiver<crate::watch::Seen>>,
        ),
        Failure,
    > {
        let job = self.job(caller, id)?;
        let rx = (!job.state.is_terminal()).then(|| self.watch.subscribe(id, job.state));
        Ok((job, rx))
    }

    /// Active jobs, plus up to `finished` ended ones (newest), oldest first; `brief` leaves
    /// out every spec (never copied, for a long queue).
    pub fn list(
        &self,
        caller: &Caller,
        finished: u32,
        only_uid: Option<u32>,
        brief: bool,
    ) -> Result<Vec<JobRecord>, Failure> {
        self.list_where(caller, finished, only_uid, brief, &ListFilter::default())
    }

    /// [`Cluster::list`] with the ended jobs those `filter` keeps (filtered before the
    /// `finished` most recent are taken), and only the active jobs in its partitions.
    pub fn list_where(
        &self,
        caller: &Caller,
        finished: u32,
        only_uid: Option<u32>,
        brief: bool,
        filter: &ListFilter,
    ) -> Result<Vec<JobRecord>, Failure> {
        let ended = &self.with_default_partition(filter)?;
        let mut out: Vec<JobRecord> = self
            .jobs
            .values()
            .filter(|j| only_uid.is_none_or(|u| j.owner.uid == u))
            .filter(|j| ended.keeps_partition(sched::partition_of(j)))
            .map(|j| if brief { j.without_spec() } else { j.clone() })
            .map(|j| self.with_pulls(j))
            .collect();
        if finished > 0 {
            let mut ended = self.store.finished_jobs_where(only_uid, finished, ended)?;
            if brief {
                ended.iter_mut().for_each(|j| j.spec = None);
            }
            // Active jobs come in id order; ended ones are merged in by id.
            out.extend(ended);
            out.sort_by_key(|j| j.id);
        }
        Ok(out.into_iter().map(|j| view(caller, j)).collect())
    }

    /// `filter` with the partition of a job that names none (the scheduler's default), or
    /// why it names a partition this cluster does not have.
    fn with_default_partition(&self, filter: &ListFilter) -> Result<ListFilter, Failure> {
        for p in &filter.partitions {
            wharf_core::cycle::partition(&self.sched, Some(p)).map_err(sched::refused)?;
        }
        let default = self.sched.default_partition_name();
        Ok(ListFilter {
            default_partition: default.to_string(),
            ..filter.clone()
        })
    }

    /// Nodes with what their jobs hold.
    pub fn nodes(&self) -> Vec<NodeRecord> {
        self.nodes
            .values()
            .map(|n| {
                let jobs: Vec<&JobRecord> = self.jobs_on(&n.info.name).collect();
                let allocated = jobs.iter().fold(Resources::default(), |acc, j| Resources {
                    cpus: acc.cpus + j.resources.cpus,
                    memory: acc.memory + j.resources.memory,
                    gpus: acc.gpus + j.resources.gpus,
                });
                NodeRecord {
                    info: n.info.clone(),
                    state: match (n.up, &n.drain) {
                        (false, _) => NodeState::Down,
                        (true, Some(_)) => NodeState::Drain,
                        (true, None) => NodeState::Up,
                    },
                    last_seen: n.last_seen,
                    allocated,
                    jobs: jobs.len() as u32,
                    images: n.images.iter().cloned().collect(),
                    // Why an up node takes no job: runs it still holds of jobs the controller
                    // moved on from (see `leftover`), as Slurm's COMPLETING.
                    reason: n.drain.as_ref().map(|d| d.reason.clone()).or_else(|| {
                        (!n.leftover.is_empty()).then(|| {
                            let ids: Vec<String> = n.leftover.iter().map(u64::to_string).collect();
                            format!(
                                "takes no job until it has killed what it still runs of job {}",
                                ids.join(", ")
                            )
                        })
                    }),
                    drained_since: n.drain.as_ref().map(|d| d.since),
                }
            })
            .collect()
    }

    /// Each partition's settings, nodes and jobs (`wharf nodes --partitions`, Slurm's
    /// `sinfo -s`); when none is configured, the one every node is in.
    pub fn partitions(&self) -> wharf_api::wire::PartitionList {
        use wharf_api::wire::{NodeCounts, PartitionSummary};
        let nodes = self.nodes();
        let parts = self.sched.partitions_or_default();
        let default = self.sched.default_partition_name();
        let mut jobs: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        for j in self.jobs.values() {
            let counts = jobs.entry(self.partition_name(j)).or_default();
            match j.state {
                JobState::Pending => counts.1 += 1,
                s if s.holds_resources() => counts.0 += 1,
                _ => {}
            }
        }
        let partitions = parts
            .iter()
            .map(|p| {
                let members: BTreeSet<&str> = p.nodes.iter().map(String::as_str).collect();
                let mut counts = NodeCounts::default();
                let (mut cpus, mut gpus) = ((0, 0), (0, 0));
                let mut registered = 0;
                for n in nodes
                    .iter()
                    .filter(|n| members.is_empty() || members.contains(n.info.name.as_str()))
                {
                    registered += 1;
                    let (have, used) = (n.info.capacity(), n.allocated);
                    // As sinfo counts them: a drained node still running jobs (draining) is
                    // in use, and its CPUs count; one running nothing is other, its CPUs
                    // still in the total. A down node is other, its CPUs left out: what it
                    // runs and has is not known now.
                    match (n.state, used.cpus) {
                        (NodeState::Down, _) => {
                            counts.other += 1;
                            continue;
                        }
                        (NodeState::Drain, 0) => counts.other += 1,
                        (_, 0) => counts.idle += 1,
                        (_, c) if c >= have.cpus => counts.allocated += 1,
                        _ => counts.mixed += 1,
                    }
                    cpus = (cpus.0 + used.cpus, cpus.1 + have.cpus);
                    gpus = (gpus.0 + used.gpus, gpus.1 + have.gpus);
                }
                // A node named here that never registered takes no work either.
                counts.other += (members.len() as u32).saturating_sub(registered);
                let (running, pending) = jobs.get(&p.name).copied().unwrap_or_default();
                let node_names = if members.is_empty() {
                    nodes.iter().map(|n| n.info.name.clone()).collect()
                } else {
                    members.iter().map(|n| n.to_string()).collect()
                };
                PartitionSummary {
                    name: p.name.clone(),
                    state: crate::admin::state_name(p.state).to_string(),
                    default: p.name == default,
                    tier: p.priority_tier,
                    max_time_s: p.max_time.map(|t| t / 1000),
                    nodes: counts,
                    cpus,
                    gpus,
                    running,
                    pending,
                    node_names: Some(node_names),
                }
            })
            .collect();
        wharf_api::wire::PartitionList { partitions }
    }

    fn jobs_on<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a JobRecord> + 'a {
        self.jobs.on_node(node)
    }

    /// Records `hash` as the key of `node` unless it holds one (see `crate::node_keys`), in
    /// the store and in `keys` (the requests' view), together under the cluster's lock so
    /// that no forget comes between.
    pub fn add_node_key(
        &mut self,
        keys: &crate::node_keys::NodeKeys,
        node: &str,
        hash: &crate::node_keys::KeyHash,
        now: u64,
    ) -> Result<crate::store::KeyAdded, Failure> {
        valid_node_name(node)?;
        let added = self.store.add_node_key(node, hash, now)?;
        if added != crate::store::KeyAdded::Other {
            keys.insert(node, *hash);
        }
        Ok(added)
    }

    /// Every node that holds a key (admins): the ones that joined, registered or not.
    pub fn node_key_list(&self, caller: &Caller) -> Result<NodeKeyList, Failure> {
        if !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                "only an admin may list the nodes' keys",
            ));
        }
        let keys = self
            .store
            .node_key_list()?
            .into_iter()
            .map(|(node, joined, registered)| NodeKeyEntry {
                node,
                joined,
                registered,
            })
            .collect();
        Ok(NodeKeyList { keys })
    }

    /// An admin forgets `node`'s key: its agent must join again. The node need not have
    /// registered (an agent may have joined and never got further).
    pub fn forget_node_key(
        &mut self,
        keys: &crate::node_keys::NodeKeys,
        caller: &Caller,
        node: &str,
    ) -> Result<(), Failure> {
        if !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                "only an admin may forget a node's key",
            ));
        }
        // Worth nothing to requests at once, whatever the store answers next.
        keys.remove(node);
        if !self.store.remove_node_key(node)? {
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("node {node:?} holds no key: its agent may join as it is"),
            ));
        }
        tracing::warn!(node, by = %caller.owner.user, "node key forgotten: its agent must join again");
        Ok(())
    }

    /// Records an agent's registration.
    pub fn register(&mut self, info: NodeInfo, now: u64) -> Result<(), Failure> {
        valid_node_name(&info.name)?;
        wharf_api::features::validate_features(&info.features).map_err(|e| {
            Failure::new(
                ErrorKind::InvalidInput,
                format!("node {}: features: {e}", info.name),
            )
        })?;
        self.store.upsert_node(&info, now)?;
        self.store.key_registered(&info.name, now)?;
        // A registration keeps what the controller knew: its images until its next report,
        // and a drain until an admin resumes it (an agent restart does not mend a node).
        let (images, drain) = self
            .nodes
            .remove(&info.name)
            .map(|n| (n.images, n.drain))
            .unwrap_or_default();
        self.nodes.insert(
            info.name.clone(),
            NodeEntry {
                info,
                images,
                last_seen: now,
                up: true,
                drain,
                last_poll: None,
                leftover: BTreeSet::new(),
            },
        );
        Ok(())
    }

    /// Takes in an agent's report: confirms started ranks, commits ended ones (and the jobs
    /// they end), fails jobs the agent lost. Returns the ended jobs the agent may now forget
    /// and the other nodes that have ranks to stop because of it.
    pub fn ingest(&mut self, report: &PollRequest, now: u64) -> Result<Ingested, Failure> {
        let Some(node) = self.nodes.get_mut(&report.node) else {
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!("node {} is not registered; register first", report.node),
            ));
        };
        if let Some(seq) = report.seq {
            let stale = node
                .last_poll
                .is_some_and(|last| last.boot == seq.boot && last.n >= seq.n);
            if stale {
                // Older than a report already taken: its jobs' absence or states are not
                // news (a job launched since would look lost).
                return Ok(Ingested {
                    stale: true,
                    ..Ingested::default()
                });
            }
            node.last_poll = Some(seq);
        }
        node.last_seen = now;
        node.up = true;
        node.images = report.images.iter().cloned().collect();
        self.take_pulls(&report.node, &report.pulling);
        self.take_prepulls(&report.node, &report.prepulls);
        let reported: BTreeMap<JobId, &AgentJob> = report.jobs.iter().map(|j| (j.id, j)).collect();
        let node = report.node.as_str();
        let mut changed = Vec::new();
        let mut forget = Vec::new();
        let mut charge = Vec::new();
        let mut drain = None;
        let mut release = BTreeSet::new();
        let mut leftover = BTreeSet::new();
        for (id, aj) in &reported {
            let ours = self
                .jobs
                .get(id)
                .filter(|j| j.state.holds_resources())
                .and_then(|j| Some((j, j.rank_on(node)? as usize)));
            match (ours, &aj.exit) {
                (Some((job, rank)), Some(exit)) => {
                    forget.push(*id);
                    if job.allocs[rank].ended() {
                        continue; // taken in already (a report repeated, or its node lost)
                    }
                    let end = aj.end_time.unwrap_or(now);
                    // A launch that failed through the node's fault drains the node.
                    if aj.start_time.is_none() {
                        drain = drain.or_else(|| drain::fault_reason(*id, exit));
                    }
                    let job = gang::rank_ended(job.clone(), rank, exit.clone(), aj.start_time, end);
                    let settled = self.settle(job, now);
                    charge.extend(settled.charge);
                    changed.push(settled.job);
                }
                (None, Some(_)) => forget.push(*id),
                // A run of a requeued job, still going on a node that was taken for lost: the
                // job waits until this node has let go of it too (it is told to kill it).
                (None, None) => {
                    leftover.insert(*id);
                    if let Some(job) = self
                        .jobs
                        .get(id)
                        .filter(|j| j.state == JobState::Pending)
                        .filter(|j| !j.requeued_from.iter().any(|n| n == node))
                    {
                        changed.push(requeue::still_held(job, node));
                    }
                }
                (Some((job, rank)), None) if !job.allocs[rank].ended() => {
                    let alloc = &job.allocs[rank];
                    let was = gang::released(job);
                    let job = if let (Some(at), None) = (aj.start_time, alloc.start_time) {
                        gang::rank_started(job.clone(), rank, at)
                    } else if aj.ready && !alloc.ready && job.state == JobState::Starting {
                        gang::rank_ready(job.clone(), rank)
                    } else {
                        continue;
                    };
                    // The last node ready (or started, by an agent that predates the
                    // barrier): the others hear of their release now.
                    let stopping = job.stop.is_some() || job.cancel_requested;
                    if !was && gang::released(&job) && !stopping {
                        release.extend(job.nodes().filter(|n| *n != node).map(String::from));
                    }
                    changed.push(job);
                }
                _ => {}
            }
        }
        if let Some(entry) = self.nodes.get_mut(node) {
            if entry.leftover != leftover {
                tracing::info!(node, runs = ?leftover, "runs the controller has moved on from");
            }
            entry.leftover = leftover;
        }
        // A requeued job's last run is gone from this node: one fewer to wait for.
        changed.extend(
            self.requeued_from(node)
                .filter(|j| !reported.contains_key(&j.id))
                .map(|j| requeue::let_go(j, node)),
        );
        for job in self.jobs_on(node) {
            let Some(rank) = job.rank_on(node).map(|r| r as usize) else {
                continue;
            };
            let alloc = &job.allocs[rank];
            if reported.contains_key(&job.id) || alloc.ended() {
                continue;
            }
            let stopping = job.cancel_requested || job.stop.is_some();
            let job = if alloc.start_time.is_some() {
                // It ran here, and the node no longer has it.
                let why = format!(
                    "node {node} no longer has this job (agent restarted without its state?)"
                );
                gang::rank_lost(job.clone(), rank, why, false, now)
            } else if stopping {
                gang::rank_never_started(job.clone(), rank, now)
            } else {
                continue; // its launch order goes out with this answer
            };
            let settled = self.settle(job, now);
            charge.extend(settled.charge);
            changed.push(settled.job);
        }
        if let Some(reason) = drain {
            self.drain(node, &reason, now)?;
        }
        self.charge_requeued(&charge);
        let mut wake = stopping_nodes(&changed, node);
        wake.extend(release);
        self.commit(changed)?;
        Ok(Ingested {
            forget,
            wake,
            stale: false,
        })
    }

    /// Marks nodes silent for longer than the node timeout as down; their jobs' ranks there
    /// are taken as ended, and the jobs' other ranks are stopped. Returns the nodes that have
    /// ranks to stop.
    pub fn check_nodes(&mut self, now: u64) -> Result<BTreeSet<String>, Failure> {
        let mut lost = Vec::new();
        for n in self.nodes.values_mut() {
            if n.up && now.saturating_sub(n.last_seen) > self.node_timeout_ms {
                n.up = false;
                lost.push(n.info.name.clone());
            }
        }
        // A job may lose several nodes at once: each change builds on the one before.
        let mut changed: BTreeMap<JobId, JobRecord> = BTreeMap::new();
        let mut charge = Vec::new();
        for name in &lost {
            // A node that is down cleans nothing up: its requeued jobs need not wait for it.
            let waiting: Vec<JobRecord> = self.requeued_from(name).cloned().collect();
            for job in waiting {
                let job = changed.get(&job.id).cloned().unwrap_or(job);
                changed.insert(job.id, requeue::let_go(&job, name));
            }
            let on: Vec<JobRecord> = self.jobs_on(name).cloned().collect();
            for job in on {
                let job = changed.get(&job.id).cloned().unwrap_or(job);
                let Some(rank) = job.rank_on(name).map(|r| r as usize) else {
                    continue;
                };
                if !job.state.holds_resources() || job.allocs[rank].ended() {
                    continue;
                }
                let why = format!("node {name} stopped responding");
                let job = gang::rank_lost(job, rank, why, true, now);
                let settled = self.settle(job, now);
                charge.extend(settled.charge);
                changed.insert(settled.job.id, settled.job);
            }
        }
        self.charge_requeued(&charge);
        let changed: Vec<JobRecord> = changed.into_values().collect();
        let wake = stopping_nodes(&changed, "");
        self.commit(changed)?;
        Ok(wake)
    }

    /// Runs that ended in a requeue (their jobs go on): charged to fair share, and kept for
    /// the ledger, which gets them with the next commit.
    fn charge_requeued(&mut self, runs: &[JobRecord]) {
        for run in runs {
            self.charge(run);
            let row = self.run_of(run, crate::ledger::REQUEUED);
            self.requeued_runs.extend(row);
        }
    }

    /// Runs `f` with its commits not waiting for the disk, then makes them all durable with
    /// one sync: several commits in a row (a group of submits, then the pass that starts
    /// them) cost one wait for the disk instead of one each, and are all durable before
    /// anyone hears of them when this returns `Ok`. On `Err` they may or may not be: the
    /// caller tells no one of them. A panic in `f` leaves the store durable again.
    pub fn durable_once<T>(&mut self, f: impl FnOnce(&mut Cluster) -> T) -> Result<T, Failure> {
        self.store.set_durable(false)?;
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        let restored = self.store.set_durable(true);
        let out = out.unwrap_or_else(|p| std::panic::resume_unwind(p));
        restored?;
        self.store.sync()?;
        Ok(out)
    }

    /// How long the last scheduling pass took to decide, not counting the commit of what it
    /// decided: the work a pass costs whatever the disk does.
    pub fn deciding(&self) -> std::time::Duration {
        self.deciding
    }

    /// Sets how long the last pass took to decide, as if one had.
    #[cfg(test)]
    pub fn set_deciding(&mut self, took: std::time::Duration) {
        self.deciding = took;
    }

    /// Stores changed jobs in one transaction, then updates memory (active jobs only).
    fn commit(&mut self, mut changed: Vec<JobRecord>) -> Result<(), Failure> {
        if changed.is_empty() {
            self.requeued_runs.clear();
            return Ok(());
        }
        for job in &changed {
            if let Some(old) = self.jobs.get(&job.id) {
                debug_assert!(
                    old.state == job.state || old.state.can_become(job.state),
                    "{} -> {}",
                    old.state,
                    job.state
                );
            }
        }
        // Only a pending job waits for something, and only its plan is of use: a start, a
        // cancel or an end clears its reason, its priority and when it was expected to start.
        for job in changed.iter_mut().filter(|j| j.state != JobState::Pending) {
            job.pending_reason = None;
            job.priority = None;
            job.expected_start = None;
        }
        // A job that ends or goes back to the queue ends its steps with it.
        for job in changed.iter_mut().filter(|j| !j.state.holds_resources()) {
            let at = job.end_time.unwrap_or_default();
            steps::close(job, at);
        }
        self.store_with_runs(&changed)?;
        for job in changed {
            self.watch.changed(&job);
            if job.state != JobState::Starting {
                self.pulls.remove(&job.id);
            }
            if job.state.is_terminal() {
                self.credentials.remove(job.id);
                self.charge(&job);
                self.jobs.remove(job.id);
            } else {
                self.jobs.insert(job);
            }
        }
        Ok(())
    }
}

/// What an agent's report came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ingested {
    /// Ended jobs the agent may forget.
    pub forget: Vec<JobId>,
    /// Other nodes with ranks to stop now (a rank here failed or ended its job's run).
    pub wake: BTreeSet<String>,
    /// The report was older than one already taken, and nothing of it was.
    pub stale: bool,
}

/// A node name is 1 to 255 bytes, with no `/`, NUL or other control character.
fn valid_node_name(name: &str) -> Result<(), Failure> {
    if name.is_empty()
        || name.len() > 255
        || name.contains('/')
        || name.chars().any(char::is_control)
    {
        return Err(Failure::new(
            ErrorKind::InvalidInput,
            format!("invalid node name {name:?}"),
        ));
    }
    Ok(())
}

/// The nodes, other than `except`, of `changed` jobs that still hold them and are being
/// stopped: their agents are to hear of it now rather than at their next poll.
fn stopping_nodes(changed: &[JobRecord], except: &str) -> BTreeSet<String> {
    changed
        .iter()
        .filter(|j| j.state.holds_resources() && (j.stop.is_some() || j.cancel_requested))
        .flat_map(|j| j.allocs.iter().filter(|a| !a.ended()))
        .map(|a| a.node.clone())
        .filter(|n| n != except)
        .collect()
}

fn not_yours(id: JobId) -> Failure {
    Failure::new(
        ErrorKind::PermissionDenied,
        format!("job {id} belongs to another user; only its owner or an admin may do that"),
    )
}

/// `job` ended as `exit` says (the exit of the rank that decides it, see [`gang`]), its
/// ranks having run from `start` to `end`.
fn finish(mut job: JobRecord, exit: &ExitInfo, start: Option<u64>, end: u64) -> JobRecord {
    job.state = exit.final_state();
    job.start_time = job.start_time.or(start);
    job.end_time = Some(end);
    job.cancel_requested = false;
    job.reason = match job.state {
        JobState::OutOfMemory | JobState::Timeout => ended_reason(&job),
        JobState::Failed => exit
            .message
            .clone()
            .map(wharf_api::text::bound_message)
            .or_else(|| Some(format!("exit {}", exit.code_signal()))),
        _ => None,
    };
    // An agent of an older version sends a launch error whole: what is kept is bounded.
    let mut exit = exit.clone();
    exit.message = exit.message.map(wharf_api::text::bound_message);
    job.exit = Some(exit);
    job
}
