//! The controller's side of scheduling: builds the core's [`SchedState`] from the jobs and
//! nodes it holds, applies the [`wharf_core::Plan`], and keeps fair-share usage.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::node::GpuInfo;
use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, JobRecord, JobSpec, JobState, NodeAlloc, Resources, Stop};
use wharf_core::cycle::{self, JobFacts};
use wharf_core::{
    limits, select, Assoc, Gpu, Hold, Node, NodeState as SchedNodeState, PendingJob, PendingReason,
    Request, Selection, State as SchedState, UsageLedger,
};

use super::{Caller, Cluster, Failure};
use crate::store::StoreError;

/// How many of the most recent ended jobs a controller start charges to fair share.
const USAGE_HISTORY: u32 = 50_000;

impl Cluster {
    /// One scheduling pass. Returns the nodes that got work.
    ///
    /// The decisions around the pass are the core's shared ones ([`cycle`]), the same the
    /// simulator makes: the jobs become the core's inputs through [`JobFacts`], and the plan
    /// becomes starts, stops and waiting jobs' notes through [`cycle::apply`] and
    /// [`cycle::waiting_note`]. What is kept here is the store and the records.
    pub fn schedule(&mut self, now: u64) -> Result<BTreeSet<String>, Failure> {
        let began = std::time::Instant::now();
        let (mut state, facts) = self.sched_state(now);
        if state.pending.is_empty() {
            self.reserved.clear();
            self.deciding = began.elapsed();
            return Ok(BTreeSet::new());
        }
        state.budget = self.budget_usage(now);
        let never = self.apply_dependencies(&mut state)?;
        // Cancelled by this pass, or left queued: either way not gone yet, so a job that
        // depends on one waits for it.
        state.outside.extend(never.iter().map(|n| n.job));
        // Before the throttles, so that a task held for its QoS takes no place under one.
        let revoked = self.hold_revoked_qos(&mut state);
        state.outside.extend(revoked);
        let throttled = self.apply_array_throttles(&mut state, now);
        // A job that depends on a task held back by its throttle still waits for it.
        state.outside.extend(throttled);
        state.reserved = std::mem::take(&mut self.reserved);
        let plan = self.scheduler.schedule(now, &state, &self.sched);
        self.reserved = wharf_core::kept_reservations(&plan);
        let applied = cycle::apply(&plan, |id| facts.get(&id));
        let mut started = self.never_met(never, now);
        let mut woken = BTreeSet::new();
        for launch in &applied.launches {
            // All of a gang's nodes at once, in rank order (the core decides them together).
            let Some(rec) = self.jobs.get(&launch.job) else {
                continue;
            };
            let mut rec = rec.clone();
            // An exclusive run holds its whole nodes, one that asked for `--mem=0` their whole
            // memory (and launches with them, see `launch_spec`); the spec keeps what the job
            // asked for, which a requeue goes back to.
            if rec
                .spec
                .as_ref()
                .is_some_and(|s| s.exclusive || s.memory_whole)
            {
                rec.resources = launch.resources;
            }
            rec.state = JobState::Starting;
            rec.allocs = launch
                .allocs
                .iter()
                .map(|a| NodeAlloc::new(&a.node, a.cpu_ids.clone(), a.gpu_ids.clone()))
                .collect();
            rec.reason = Some(format!("starting on {}", rec.nodelist()));
            rec.requeued_after = None;
            rec.requeued_message = None;
            rec.port = launch.port;
            rec.priority = None;
            rec.expected_start = None;
            woken.extend(rec.nodes().map(str::to_string));
            started.push(rec);
        }
        // Committed with the starts: a preemption and the reservation it makes are one
        // decision.
        for p in &applied.stops {
            let Some(rec) = self.jobs.get(&p.job) else {
                continue;
            };
            let mut rec = rec.clone();
            let stop = Stop::Preempt {
                by: p.by,
                requeue: p.requeue,
            };
            tracing::info!(
                job = p.job,
                by = p.by,
                requeue = p.requeue,
                "preempting job"
            );
            rec.reason = Some(format!("{stop}; stopping"));
            rec.stop = Some(stop);
            woken.extend(rec.nodes().map(str::to_string));
            started.push(rec);
        }
        let weights = self.sched.weights;
        for wait in &plan.waiting {
            let mut note = cycle::waiting_note(&plan, wait, now, &weights, facts.get(&wait.job));
            if let PendingReason::Dependency { on } = wait.reason {
                note.reason = self.dependency_words(wait.job, on, &wait.reason, note.reason);
            }
            self.jobs.edit(wait.job, |rec| {
                rec.priority = note.priority;
                rec.expected_start = note.expected_start;
                rec.reason = Some(note.reason);
                rec.pending_reason = Some(wait.reason.clone());
            });
        }
        self.deciding = began.elapsed();
        self.commit(started)?;
        Ok(woken)
    }

    /// `reason` of `job`, waiting for job `on`, in the user's words: the job `on` as they
    /// name it (`68_3` for an array task) and the `--dependency` they gave, in place of the
    /// core's general sentence.
    fn dependency_words(
        &self,
        job: JobId,
        on: JobId,
        why: &PendingReason,
        reason: String,
    ) -> String {
        let Some(dep) = self.jobs.get(&job).and_then(|j| j.dependency.as_ref()) else {
            return reason;
        };
        let label = self.job_label(on);
        let words = format!(
            "{}: waiting for job {label}, as its --dependency {dep} asks",
            why.code()
        );
        reason.replacen(&why.to_string(), &words, 1)
    }

    /// The fair-share tree at `now` (`wharf share`), each user's factor the one the next
    /// pass would give its jobs. A user sees its own lines and the accounts above them (an
    /// account's usage sums everyone's under it); an admin every account, and with `all`
    /// every user.
    pub fn fair_share(
        &self,
        caller: &Caller,
        all: bool,
        now: u64,
    ) -> Result<wharf_api::share::ShareTree, Failure> {
        if all && !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                "only admins see other users' fair-share lines; leave out --all to see your own",
            ));
        }
        let (state, _) = self.sched_state(now);
        let rows = wharf_core::fair_share(now, &state, &self.sched);
        let mine = |r: &wharf_api::share::ShareRow| {
            r.user.as_ref().is_some_and(|u| *u == caller.owner.user)
        };
        let rows = match (caller.admin, all) {
            (true, true) => rows,
            (true, false) => rows
                .into_iter()
                .filter(|r| r.user.is_none() || mine(r))
                .collect(),
            (false, _) => {
                // Depth first: the accounts above a line are the last ones seen at each
                // shallower depth.
                let mut keep = vec![false; rows.len()];
                let mut above: Vec<usize> = Vec::new();
                for (i, r) in rows.iter().enumerate() {
                    above.truncate(r.depth as usize);
                    if r.user.is_none() {
                        above.push(i);
                    } else if mine(r) {
                        keep[i] = true;
                        for &a in &above {
                            keep[a] = true;
                        }
                    }
                }
                (rows.into_iter().zip(keep))
                    .filter_map(|(r, k)| k.then_some(r))
                    .collect()
            }
        };
        Ok(wharf_api::share::ShareTree {
            half_life_ms: self.sched.half_life,
            rows,
        })
    }

    /// The scheduler's view: every node (GPUs with the ids their agent reported), running
    /// jobs expected to end at start + time limit, pending jobs, and decayed usage, with what
    /// it was built from for each job. Each user is its own fair-share account until
    /// accounts are configured.
    fn sched_state(&self, now: u64) -> (SchedState, BTreeMap<JobId, JobFacts>) {
        let nodes = self.sched_nodes();
        let mut running = Vec::new();
        let mut pending = Vec::new();
        let mut outside = BTreeSet::new();
        let mut stopping = BTreeSet::new();
        let mut facts = BTreeMap::new();
        for job in self.jobs.values() {
            if job.state.holds_resources() && (job.cancel_requested || job.stop.is_some()) {
                stopping.insert(job.id);
            }
            match job.state {
                s if s.holds_resources() && !job.allocs.is_empty() => {
                    let f = job_facts(job);
                    running.push(
                        f.running(
                            &self.sched,
                            // A job still starting is taken to start now.
                            job.start_time.unwrap_or(now),
                            job.allocs
                                .iter()
                                .map(|a| (a.node.clone(), a.cpu_ids.clone(), a.gpu_ids.clone())),
                            job.port,
                        ),
                    );
                    facts.insert(job.id, f);
                }
                // Not before its nodes have let go of its last run (see `requeued_from`); a job
                // that depends on it still waits for it.
                JobState::Pending if !job.requeued_from.is_empty() => {
                    outside.insert(job.id);
                }
                JobState::Pending => {
                    let f = job_facts(job);
                    pending.push(f.pending(&self.sched));
                    facts.insert(job.id, f);
                }
                _ => {}
            }
        }
        let state = SchedState {
            nodes,
            running,
            pending,
            usage: self.usage.snapshot(now),
            stopping,
            budget: Default::default(),
            reserved: BTreeMap::new(),
            outside,
        };
        (state, facts)
    }

    /// Every node (GPUs with the ids their agent reported, its features) as the core sees it.
    pub(super) fn sched_nodes(&self) -> Vec<Node> {
        self.nodes
            .values()
            .map(|n| {
                let mut node = Node::new(
                    &n.info.name,
                    n.info.cpus,
                    n.info.memory,
                    sched_gpus(&n.info.gpus),
                );
                node.cpu_numa = n.info.cpu_numa.clone();
                node.features = n.info.features.clone();
                if !n.up {
                    node.state = SchedNodeState::Down;
                } else if n.drain.is_some() || !n.leftover.is_empty() {
                    // Runs the controller has moved on from still use it until they are gone.
                    node.state = SchedNodeState::Drain;
                }
                node
            })
            .collect()
    }

    /// Names the default partition, the user's default account and the default QoS in a job
    /// that names none, as they are at submit (as Slurm does): a later change of any default
    /// moves no queued job to where it was never checked. Without configured partitions (one
    /// implicit partition of every node), accounts (each user its own) or a default QoS,
    /// there is nothing to fix.
    pub(super) fn fix_defaults(&self, spec: &mut JobSpec, user: &str) {
        if spec.partition.is_none() && !self.sched.partitions.is_empty() {
            spec.partition = Some(self.sched.default_partition_name().to_string());
        }
        // A user in no account is refused by `check_account` once accounts exist.
        if spec.account.is_none() && !self.sched.accounts.is_empty() {
            spec.account = Some(self.assoc_for(Some(spec), user).account);
        }
        if spec.qos.is_none() {
            spec.qos = self.sched.limits.default_qos.clone();
            spec.qos_defaulted = spec.qos.is_some();
        }
    }

    /// Gives a job what it left to its partition: its time limit ([`cycle::default_time`])
    /// when it gave none, its memory ([`cycle::default_memory`]) when it asked for none. A
    /// partition that does not exist is [`Cluster::check_partition`]'s to refuse.
    pub(super) fn partition_defaults(&self, spec: &mut JobSpec) -> Result<(), Failure> {
        let Ok(part) = cycle::partition(&self.sched, spec.partition.as_deref()) else {
            return Ok(());
        };
        if spec.time_defaulted {
            let site = self.defaults.site_time();
            spec.time_limit = (cycle::default_time(part, site.saturating_mul(1000)) / 1000).max(1);
        }
        if spec.time_unlimited {
            spec.time_limit = self.unlimited_time(part);
        }
        if spec.memory_defaulted {
            let r = spec.resources;
            spec.resources.memory =
                cycle::default_memory(part, r.cpus, r.gpus, self.defaults.memory);
            // The site's ceilings hold for what a partition's defaults give too.
            self.defaults
                .max_resources
                .check(&spec.resources)
                .map_err(|m| {
                    Failure::new(
                        ErrorKind::InvalidInput,
                        format!(
                            "with partition {}'s default memory per CPU or GPU: {m}; give --mem",
                            part.map_or(wharf_core::DEFAULT_PARTITION, |p| p.name.as_str())
                        ),
                    )
                })?;
        }
        Ok(())
    }

    /// What `UNLIMITED` is in partition `part`, seconds: its MaxTime, never over the site's
    /// maximum.
    pub(super) fn unlimited_time(&self, part: Option<&wharf_core::Partition>) -> u64 {
        let site = self.defaults.max_time;
        part.and_then(|p| p.max_time)
            .map_or(site, |ms| (ms / 1000).clamp(1, site))
    }

    /// Refuses a job whose partition does not exist, takes no new jobs, allows less time or
    /// memory per CPU or GPU than it asks for, has fewer nodes than it asks for, or is closed
    /// to the caller's account or groups. All but the last are the core's shared admission
    /// ([`cycle::admit`]).
    pub(super) fn check_partition(&self, spec: &JobSpec, caller: &Caller) -> Result<(), Failure> {
        let job = JobFacts {
            partition: spec.partition.clone(),
            // Memory the partition's defaults gave is not held against its maxima: only what
            // the job asked for is.
            resources: Resources {
                memory: if spec.memory_defaulted {
                    0
                } else {
                    spec.resources.memory
                },
                ..spec.resources
            },
            time_limit: spec.time_limit.saturating_mul(1000),
            nodes: spec.nodes,
            ..JobFacts::default()
        };
        match cycle::admit(&self.sched, &job, self.nodes.len()).map_err(refused)? {
            Some(part) => self.check_access(part, spec, caller),
            None => Ok(()),
        }
    }

    /// Who a job runs for: the account it named, else its user's default account (the first
    /// configured for them), else an account of the user's own name.
    pub(super) fn assoc(&self, job: &JobRecord) -> Assoc {
        self.assoc_for(job.spec.as_ref(), &job.owner.user)
    }

    /// [`Cluster::assoc`] of a job `user` submits with `spec`.
    pub(super) fn assoc_for(&self, spec: Option<&JobSpec>, user: &str) -> Assoc {
        cycle::assoc(&self.sched, spec.and_then(|s| s.account.as_deref()), user)
    }

    /// Refuses an account the user is not in and, once accounts are configured (in the file
    /// or with `wharf admin`), a user with no association at all (Slurm's enforced
    /// associations).
    pub(super) fn check_account(&self, spec: &JobSpec, user: &str) -> Result<(), Failure> {
        let mine: Vec<&str> = self
            .sched
            .users
            .iter()
            .filter(|u| u.user == user)
            .map(|u| u.account.as_str())
            .collect();
        if mine.is_empty() && !self.sched.accounts.is_empty() {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                format!(
                    "user {user} is in no account of this cluster; an admin or an account's \
                     coordinator must add you first (`wharf admin user add {user} --account ACCOUNT`)"
                ),
            ));
        }
        let Some(account) = spec.account.as_deref() else {
            return Ok(());
        };
        if mine.contains(&account) || (mine.is_empty() && account == user) {
            return Ok(());
        }
        let yours = if mine.is_empty() {
            format!("you are charged to your own account {user:?}")
        } else {
            format!("yours: {}", mine.join(", "))
        };
        Err(Failure::new(
            ErrorKind::InvalidInput,
            format!("you are not in account {account:?} ({yours}); leave --account out or name one of yours"),
        ))
    }

    /// Refuses a GPU type no node has enough of (when nodes have joined: a job that could never
    /// run).
    pub(super) fn check_gpu_type(&self, spec: &JobSpec) -> Result<(), Failure> {
        let Some(kind) = spec.gpu_type.as_deref() else {
            return Ok(());
        };
        if self.nodes.is_empty() {
            return Ok(());
        }
        let mut counts: BTreeMap<String, u32> = BTreeMap::new();
        let mut best = 0;
        for n in self.nodes.values() {
            let mut per_node: BTreeMap<String, u32> = BTreeMap::new();
            // By unit: each MIG instance of its profile, never its GPU whole.
            for u in n.info.gpus.iter().flat_map(GpuInfo::units) {
                *per_node.entry(u.kind).or_default() += 1;
            }
            best = best.max(per_node.get(kind).copied().unwrap_or(0));
            for (k, c) in per_node {
                let e = counts.entry(k).or_default();
                *e = (*e).max(c);
            }
        }
        if best >= spec.resources.gpus {
            return Ok(());
        }
        let have: Vec<String> = counts
            .iter()
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, c)| format!("{k}:{c}"))
            .collect();
        Err(Failure::new(
            ErrorKind::InvalidInput,
            format!(
                "no node has {} {kind} GPUs; the most of each type on one node: {}",
                spec.resources.gpus,
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            ),
        ))
    }

    /// Holds back (`InvalidQOS`, as Slurm) the pending jobs in `state` whose QoS their
    /// association no longer grants, or that no longer exists, unless an admin set it.
    /// Returns them; the next pass looks again, so a grant given back releases them.
    pub(super) fn hold_revoked_qos(&mut self, state: &mut SchedState) -> Vec<JobId> {
        if self.sched.accounts.is_empty() {
            return Vec::new();
        }
        let mut held: Vec<(JobId, String)> = Vec::new();
        state.pending.retain(|p| {
            let Some(job) = self.jobs.get(&p.id) else {
                return true;
            };
            let Some(spec) = job.spec.as_ref().filter(|s| !s.qos_by_admin) else {
                return true;
            };
            let Some(qos) = spec.qos.as_deref() else {
                return true;
            };
            let assoc = self.assoc_for(Some(spec), &job.owner.user);
            let granted = if spec.qos_defaulted {
                self.sched.qos.iter().any(|d| d.name == qos)
            } else {
                cycle::qos_granted(&self.sched, &assoc, qos)
            };
            if !granted {
                held.push((p.id, qos.to_string()));
            }
            granted
        });
        for (id, qos) in &held {
            self.hold_back(*id, PendingReason::InvalidQos { qos: qos.clone() });
        }
        held.into_iter().map(|(id, _)| id).collect()
    }

    /// Marks pending job `id` as held back from this pass by the caller for `reason`: it
    /// has no priority and no expected start until a pass considers it again.
    pub(super) fn hold_back(&mut self, id: JobId, reason: PendingReason) {
        let words = reason.to_string();
        self.jobs.edit(id, |rec| {
            rec.reason = Some(words);
            rec.pending_reason = Some(reason);
            rec.priority = None;
            rec.expected_start = None;
        });
    }

    /// Refuses an unknown QoS, one the job's association (of `owner`) may not use, and a
    /// negative nice, from anyone but an admin (it would raise the job above others): the
    /// core's shared admission ([`cycle::admit_qos`]).
    ///
    /// Only what `check` names is checked ([`Checked`]): an update answers for what it
    /// changes, not for a QoS or a nice an admin set.
    pub(super) fn check_qos_and_nice(
        &self,
        spec: &JobSpec,
        caller: &Caller,
        owner: &str,
        check: Checked,
    ) -> Result<(), Failure> {
        let assoc = self.assoc_for(Some(spec), owner);
        // A QoS fixed from the default at submit was the default then, which anyone may use.
        let named = spec
            .qos
            .as_deref()
            .filter(|_| check.qos && !spec.qos_defaulted);
        let nice = if check.nice { spec.nice } else { 0 };
        cycle::admit_qos(&self.sched, named, nice, caller.admin, &assoc).map_err(refused)
    }

    /// Refuses a job that could never start under a QoS or association limit (over MaxWall,
    /// MaxTRESPerJob, or a per-user or group TRES cap on its own), and a submit that would
    /// take the user over MaxSubmitJobsPerUser or MaxSubmitJobs.
    /// `earlier` are the (association, QoS) of the jobs of submits before this one in its
    /// group, not stored yet; `tasks` how many jobs this one is (an array's tasks each count);
    /// `replaces` the stored job it changes (an update), not counted again.
    pub(super) fn check_limits(
        &self,
        spec: &JobSpec,
        owner: &wharf_api::Owner,
        earlier: &[(Assoc, Option<String>)],
        tasks: usize,
        replaces: &BTreeSet<JobId>,
    ) -> Result<(), Failure> {
        let this = self.check_job_limits(spec, owner)?;
        self.check_caps(owner, &this, earlier, tasks, replaces)
    }

    /// The first half of [`Cluster::check_limits`]: refuses a job that could never start
    /// under its QoS or association limits on its own. Returns the (association, QoS) it
    /// counts toward.
    pub(super) fn check_job_limits(
        &self,
        spec: &JobSpec,
        owner: &wharf_api::Owner,
    ) -> Result<(Assoc, Option<String>), Failure> {
        let assoc = self.assoc_for(Some(spec), &owner.user);
        let qos = self.qos_of(Some(spec));
        if self.sched.limits.is_empty() {
            return Ok((assoc, qos));
        }
        let mut job = PendingJob::new(0, assoc, request(spec.resources, Some(spec)), 0);
        job.qos = qos;
        let limit = spec.time_limit.saturating_mul(1000);
        if let Some(reason) = limits::never_fits(&self.sched, &job, limit) {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                format!("this job could never start: {reason}"),
            ));
        }
        if spec.exclusive {
            job.request.gpu_kind = spec.gpu_type.clone();
            job.partition = spec.partition.clone();
            job.select = selection(spec);
            let nodes = self.sched_nodes();
            if let Some(reason) = select::exclusive_never_fits(&self.sched, &nodes, &job, limit) {
                return Err(Failure::new(
                    ErrorKind::InvalidInput,
                    format!(
                        "this job could never start: it is exclusive, so it is charged the \
                         whole nodes it may use, and {reason}; drop --exclusive or ask for \
                         nodes within the limit"
                    ),
                ));
            }
        }
        Ok((job.assoc, job.qos))
    }

    /// The second half of [`Cluster::check_limits`]: refuses one more job counted toward
    /// `this` (association, QoS) when it would take its owner over a submit cap, with the
    /// owner's active jobs but `replaces`, `earlier` and `tasks - 1` more like it counted.
    pub(super) fn check_caps(
        &self,
        owner: &wharf_api::Owner,
        this: &(Assoc, Option<String>),
        earlier: &[(Assoc, Option<String>)],
        tasks: usize,
        replaces: &BTreeSet<JobId>,
    ) -> Result<(), Failure> {
        let limits = &self.sched.limits;
        if limits.is_empty() {
            return Ok(());
        }
        let capped = limits
            .qos
            .values()
            .any(|q| q.max_submit_jobs_per_user.is_some())
            || limits
                .accounts
                .values()
                .any(|a| a.max_submit_jobs.is_some())
            || limits.users.values().any(|u| u.max_submit_jobs.is_some());
        if !capped {
            return Ok(());
        }
        // Pending and running jobs of this user: only theirs can count toward their caps. The
        // job checked is the last; an array's other tasks count before it.
        let active: Vec<(Assoc, Option<String>)> = self
            .jobs
            .active_of(owner.uid)
            .filter(|j| !replaces.contains(&j.id))
            .map(|j| (self.assoc(j), self.qos_of(j.spec.as_ref())))
            .chain(earlier.iter().cloned())
            .chain(std::iter::repeat_n(this.clone(), tasks.saturating_sub(1)))
            .collect();
        limits::submit_fits(
            &self.sched,
            &this.0,
            this.1.as_deref(),
            active.iter().map(|(a, q)| (a, q.as_deref())),
        )
        .map_err(|reason| Failure::new(ErrorKind::Unavailable, format!("refused: {reason}")))
    }

    /// The QoS a job runs in: the one it names, else the configured default.
    pub(super) fn qos_of(&self, spec: Option<&JobSpec>) -> Option<String> {
        cycle::qos(&self.sched, spec.and_then(|s| s.qos.as_deref()))
    }

    /// Rebuilds fair-share usage from the ledger's most recent runs (requeued runs included,
    /// each at the rate it was billed), or from the state store's ended jobs when the ledger
    /// cannot be read now.
    pub(super) fn replay_usage(&mut self) -> Result<(), StoreError> {
        self.usage = UsageLedger::new(self.sched.half_life);
        match self.ledger.last_ended(USAGE_HISTORY) {
            Ok(runs) => {
                for run in runs.iter().rev() {
                    self.charge_run(run);
                }
            }
            Err(e) => {
                tracing::warn!(
                    "fair share: the accounting ledger cannot be read ({e}); replaying the \
                     state store's ended jobs instead"
                );
                let mut ended = self.store.finished_jobs(None, USAGE_HISTORY)?;
                ended.reverse();
                for job in &ended {
                    self.charge(job);
                }
            }
        }
        Ok(())
    }

    /// Charges one ledger run: its billing rate for as long as it held its resources.
    fn charge_run(&mut self, run: &crate::ledger::JobRun) {
        let Some(start) = run.start_time else {
            return;
        };
        let assoc = Assoc::new(&run.account, &run.user);
        (self.usage).record_run(&assoc, run.billing, start, run.end_time);
    }

    /// Charges an ended job's billing-weighted TRES-seconds to its user for fair share.
    pub(super) fn charge(&mut self, job: &JobRecord) {
        let (Some(start), Some(end)) = (job.start_time, job.end_time) else {
            return;
        };
        // Resources are per node: a gang is charged for every node it held.
        let r = job.resources;
        let nodes = job.allocs.len().max(1) as f64;
        let rate = nodes
            * self.sched.billing_for(partition(job).as_deref()).rate(
                r.cpus.into(),
                r.memory,
                r.gpus.into(),
            );
        let assoc = self.assoc(job);
        self.usage.record_run(&assoc, rate, start, end);
    }
}

/// A submit refused by the core's shared admission.
pub(super) fn refused(r: cycle::Refusal) -> Failure {
    Failure::new(r.kind, r.message)
}

/// What a job asks the core for: `resources` on each of its nodes.
fn request(resources: Resources, spec: Option<&JobSpec>) -> Request {
    let mut req = cycle::request(resources, spec.map_or(1, |s| s.nodes));
    req.whole_memory = spec.is_some_and(|s| s.memory_whole);
    req
}

/// A job record in the terms the core's shared pass code ([`cycle`]) takes.
fn job_facts(job: &JobRecord) -> JobFacts {
    let spec = job.spec.as_ref();
    JobFacts {
        id: job.id,
        user: job.owner.user.clone(),
        account: spec.and_then(|s| s.account.clone()),
        partition: partition(job),
        qos: spec.and_then(|s| s.qos.clone()),
        resources: job.resources,
        nodes: spec.map_or(1, |s| s.nodes),
        time_limit: job.time_limit.saturating_mul(1000),
        submit: job.submit_time,
        begin: job.begin_time,
        hold: job.hold.map(|h| match h {
            wharf_api::Hold::User => Hold::User,
            wharf_api::Hold::Admin => Hold::Admin,
        }),
        nice: spec.map_or(0, |s| s.nice),
        priority: spec.and_then(|s| s.priority),
        gpu_kind: spec.and_then(|s| s.gpu_type.clone()),
        select: spec.map(selection).unwrap_or_default(),
        whole_memory: spec.is_some_and(|s| s.memory_whole),
        requeue: spec.is_none_or(|s| s.requeue),
        requeued_words: job.requeued_after.as_ref().map(Stop::requeue_words),
    }
}

/// The core's view of a job's node selection.
pub(super) fn selection(spec: &JobSpec) -> Selection {
    Selection {
        constraint: spec.constraint.clone(),
        nodelist: spec.nodelist.names().iter().cloned().collect(),
        exclude: spec.exclude.names().iter().cloned().collect(),
        exclusive: spec.exclusive,
    }
}

pub(super) fn partition(job: &JobRecord) -> Option<String> {
    partition_of(job).map(str::to_string)
}

/// [`partition`], borrowed.
pub(super) fn partition_of(job: &JobRecord) -> Option<&str> {
    job.spec.as_ref().and_then(|s| s.partition.as_deref())
}

/// A node's GPUs as the scheduler sees them: the agent's ids and type names, and where each
/// sits (its PCIe switch named by a number of this node's own).
fn sched_gpus(gpus: &[GpuInfo]) -> Vec<Gpu> {
    let switches: BTreeSet<&str> = gpus
        .iter()
        .filter_map(|g| g.pcie_switch.as_deref())
        .collect();
    // A GPU in MIG mode is given by its instances, each of its own type, never whole.
    gpus.iter()
        .flat_map(|g| {
            let switch = g
                .pcie_switch
                .as_deref()
                .and_then(|s| switches.iter().position(|x| *x == s))
                .map(|p| p as u32);
            g.units()
                .into_iter()
                .map(move |u| Gpu::new(u.id, &u.kind).at(g.numa_node, switch))
        })
        .collect()
}

/// What [`Cluster::check_qos_and_nice`] checks: a submit both, an update what it changes
/// (the QoS also when it moves the job to another account).
#[derive(Debug, Clone, Copy)]
pub(super) struct Checked {
    /// The job's QoS, under its association.
    pub qos: bool,
    /// Its nice.
    pub nice: bool,
}

#[cfg(test)]
pub(super) mod tests;
