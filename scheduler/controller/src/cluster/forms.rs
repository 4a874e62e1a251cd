//! Holding and releasing pending jobs (Slurm's `scontrol hold` / `release`).
//!
//! ```text
//!   owner:  wharf hold J    -> held by user   (the owner or an admin may release)
//!   admin:  wharf hold J    -> held by admin  (only an admin may release)
//! ```
//!
//! A hold never lowers an admin hold to a user hold. The change is committed before the
//! answer, like every other.

use std::collections::{BTreeMap, BTreeSet};

use wharf_api::dependency::{ArrayStates, Check, DepJob, Dependency, Found};
use wharf_api::wire::ErrorKind;
use wharf_api::{Hold, JobId, JobRecord, JobState};
use wharf_core::{PendingReason, State as SchedState};

use super::{not_yours, Caller, Cluster, Failure};
use crate::visibility::view;

impl Cluster {
    /// Holds a pending job: by its owner a user hold, by an admin an admin hold. Returns the
    /// job as the caller sees it.
    pub fn hold(&mut self, caller: &Caller, id: JobId) -> Result<JobRecord, Failure> {
        let job = held(caller, self.pending_for(caller, id, "held")?);
        self.commit(vec![job.clone()])?;
        Ok(view(caller, job))
    }

    /// Releases a held job. Only an admin releases an admin hold.
    pub fn release(&mut self, caller: &Caller, id: JobId) -> Result<JobRecord, Failure> {
        let job = released(caller, self.pending_for(caller, id, "released")?)?;
        self.commit(vec![job.clone()])?;
        Ok(view(caller, job))
    }

    /// The pending job `id` if `caller` may manage it, else the error that says why not.
    fn pending_for(&self, caller: &Caller, id: JobId, what: &str) -> Result<JobRecord, Failure> {
        let job = match self.jobs.get(&id) {
            Some(j) => j.clone(),
            None => match self.store.job(id)? {
                Some(j) if caller.may_manage(&j) => j,
                Some(_) => return Err(not_yours(id)),
                None => return Err(Failure::new(ErrorKind::NotFound, format!("no job {id}"))),
            },
        };
        if !caller.may_manage(&job) {
            return Err(not_yours(id));
        }
        if job.state != JobState::Pending {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!("job {id} is {}; only pending jobs can be {what}", job.state),
            ));
        }
        Ok(job)
    }
}

/// (uid, job name) -> (the first pending job's id, a job holding resources).
type SingletonIndex<'a> = BTreeMap<(u32, &'a str), (JobId, Option<JobId>)>;

/// A pending job whose dependency can never be met, and why.
pub(super) struct NeverMet {
    pub job: JobId,
    pub on: JobId,
    pub parent_state: JobState,
}

impl Cluster {
    /// Refuses a dependency on a job that does not exist or, unless the caller is an admin,
    /// belongs to someone else (its state would tell them about another user's job).
    pub(super) fn check_dependency(
        &self,
        dep: Option<&Dependency>,
        caller: &Caller,
    ) -> Result<(), Failure> {
        let Some(dep) = dep else {
            return Ok(());
        };
        for named in dep.jobs() {
            let missing = || {
                Failure::new(
                    ErrorKind::InvalidInput,
                    format!("--dependency names job {named}, which does not exist; check the id with `wharf queue --all`"),
                )
            };
            let id = match self.resolve_task(named.id, named.task) {
                Ok(id) => id,
                Err(e) if e.kind == ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(e),
            };
            let owner = match self.jobs.get(&id) {
                Some(j) => j.owner.uid,
                None => match self.store.job(id)? {
                    Some(j) => j.owner.uid,
                    None => return Err(missing()),
                },
            };
            if owner != caller.owner.uid && !caller.admin {
                return Err(Failure::new(
                    ErrorKind::PermissionDenied,
                    format!("--dependency names job {named}, which belongs to another user; depend only on your own jobs"),
                ));
            }
        }
        Ok(())
    }

    /// Decides the dependencies of the pending jobs in `state`: a job waiting on another gets
    /// it in `after` (the core then says `Dependency`); a job whose dependency can never be met
    /// leaves `state` and is returned. What each named job (or array) is, is looked up once a
    /// pass ([`Cluster::dependency_found`]).
    pub(super) fn apply_dependencies(
        &self,
        state: &mut SchedState,
    ) -> Result<Vec<NeverMet>, Failure> {
        let mut found: BTreeMap<DepJob, Found> = BTreeMap::new();
        let mut singles: Option<SingletonIndex> = None;
        let mut never = Vec::new();
        for p in &mut state.pending {
            let Some(job) = self.jobs.get(&p.id) else {
                continue;
            };
            let Some(dep) = &job.dependency else {
                continue;
            };
            for named in dep.jobs() {
                if let std::collections::btree_map::Entry::Vacant(e) = found.entry(named) {
                    e.insert(self.dependency_found(named)?);
                }
            }
            let single = if dep.singleton {
                let index = singles.get_or_insert_with(|| self.singleton_index());
                index.get(&(job.owner.uid, job.name.as_str())).and_then(
                    |&(first_pending, running)| {
                        running.or((first_pending < job.id).then_some(first_pending))
                    },
                )
            } else {
                None
            };
            let found_of = |named: DepJob| found.get(&named).copied().unwrap_or(Found::Missing);
            match dep.check(found_of, single) {
                Check::Met => {}
                Check::Waiting(on) => p.after.push(on),
                Check::Never(on, parent_state) => never.push(NeverMet {
                    job: p.id,
                    on,
                    parent_state,
                }),
            }
        }
        // Under `kill_invalid_dependency = false` such jobs stay and are found again each
        // pass: a set keeps this linear in the queue, not queue × their number.
        let gone: BTreeSet<JobId> = never.iter().map(|n| n.job).collect();
        state.pending.retain(|p| !gone.contains(&p.id));
        Ok(never)
    }

    /// What `named` is now: a job or one array task (active ones from memory, ended ones from
    /// the store), or, for an array's job id, all of the array's tasks summed up.
    fn dependency_found(&self, named: DepJob) -> Result<Found, Failure> {
        let span = JobId::from(self.forms.max_array_size);
        if let Some(task) = named.task {
            return match self.find_task(named.id, task) {
                Ok((id, state)) => Ok(Found::Job(id, state)),
                Err(e) if e.kind == ErrorKind::NotFound => Ok(Found::Missing),
                Err(e) => Err(e),
            };
        }
        let id = named.id;
        match self.jobs.get(&id) {
            Some(j) if j.array.is_none_or(|a| a.job_id != id) => {
                return Ok(Found::Job(id, j.state))
            }
            Some(_) => {}
            // Ended: a plain job is read once; an array's task 0 (or nothing stored) sends us
            // to its tasks, some of which may not have ended.
            None => match self.store.job(id)? {
                Some(j) if j.array.is_none_or(|a| a.job_id != id) => {
                    return Ok(Found::Job(id, j.state))
                }
                _ => {}
            },
        }
        let mut tasks: BTreeMap<JobId, JobState> =
            self.store.array_states(id)?.into_iter().collect();
        let in_memory = self
            .jobs
            .range(id..id.saturating_add(span))
            .filter(|j| j.array.is_some_and(|a| a.job_id == id));
        for j in in_memory {
            tasks.insert(j.id, j.state);
        }
        // Neither a job nor an array's task: nothing by that id was ever stored.
        if tasks.is_empty() {
            return Ok(Found::Missing);
        }
        let mut sum = ArrayStates::default();
        for (id, state) in tasks {
            sum.add(id, state);
        }
        Ok(Found::Array(sum))
    }

    /// Job `id` as the user names it (`68_3` for an array task): from memory, else the
    /// store, else its id.
    pub(super) fn job_label(&self, id: JobId) -> String {
        match self.jobs.get(&id) {
            Some(j) => j.label(),
            None => {
                (self.store.job(id).ok().flatten()).map_or_else(|| id.to_string(), |j| j.label())
            }
        }
    }

    /// For each user and job name: the first pending job, and a job holding resources.
    fn singleton_index(&self) -> SingletonIndex<'_> {
        let mut index = SingletonIndex::new();
        for j in self.jobs.values() {
            let e = index
                .entry((j.owner.uid, j.name.as_str()))
                .or_insert((JobId::MAX, None));
            if j.state == JobState::Pending {
                e.0 = e.0.min(j.id);
            } else if j.state.holds_resources() {
                e.1 = Some(j.id);
            }
        }
        index
    }

    /// What a pass does with jobs whose dependency can never be met: cancels them
    /// (`kill_invalid_dependency`) or leaves them pending with the reason.
    pub(super) fn never_met(&mut self, never: Vec<NeverMet>, now: u64) -> Vec<JobRecord> {
        let mut cancelled = Vec::new();
        let kill = self.forms.kill_invalid_dependency;
        for n in never {
            let why = PendingReason::DependencyNeverSatisfied { on: n.on };
            // Left queued by an earlier pass, it says so already: nothing to look up again.
            let said = self
                .jobs
                .get(&n.job)
                .and_then(|j| j.pending_reason.as_ref());
            if !kill && said == Some(&why) {
                continue;
            }
            let label = self.job_label(n.on);
            let words = format!("{why} (job {label} ended {})", n.parent_state).replacen(
                &format!("job {} ended in a way", n.on),
                &format!("job {label} ended in a way"),
                1,
            );
            let Some(mut rec) = self.jobs.edit(n.job, |rec| {
                rec.priority = None;
                rec.expected_start = None;
                if !kill {
                    rec.reason = Some(words.clone());
                    rec.pending_reason = Some(why.clone());
                }
                rec.clone()
            }) else {
                continue;
            };
            if !kill {
                continue;
            }
            rec.state = JobState::Cancelled;
            rec.end_time = Some(now);
            rec.reason = Some(format!(
                "{words}; cancelled ([scheduler] kill_invalid_dependency)"
            ));
            tracing::info!(
                job = n.job,
                on = n.on,
                "dependency can never be met; job cancelled"
            );
            cancelled.push(rec);
        }
        cancelled
    }
}

/// `job` (pending, the caller's to manage) held: by its owner a user hold, by an admin an
/// admin hold; a hold never lowers an admin hold.
pub(super) fn held(caller: &Caller, mut job: JobRecord) -> JobRecord {
    let hold = if caller.admin {
        Hold::Admin
    } else {
        job.hold.unwrap_or(Hold::User)
    };
    job.hold = Some(hold);
    let why = match hold {
        Hold::User => PendingReason::JobHeldUser,
        Hold::Admin => PendingReason::JobHeldAdmin,
    };
    job.reason = Some(why.to_string());
    job.pending_reason = Some(why);
    job.expected_start = None;
    tracing::info!(job = job.id, by = %caller.owner.user, ?hold, "job held");
    job
}

/// `job` (pending, the caller's to manage) released, or why not: it is not held, or an admin
/// holds it and the caller is none.
pub(super) fn released(caller: &Caller, mut job: JobRecord) -> Result<JobRecord, Failure> {
    let id = job.id;
    match job.hold {
        None => {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!("job {id} is not held"),
            ))
        }
        Some(Hold::Admin) if !caller.admin => {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                format!("job {id} is held by an admin; only an admin may release it"),
            ))
        }
        Some(_) => {}
    }
    job.hold = None;
    job.reason = Some("Queued: released; waiting for the scheduler".into());
    job.pending_reason = None;
    tracing::info!(job = id, by = %caller.owner.user, "job released");
    Ok(job)
}

mod circle;
#[cfg(test)]
pub(super) mod tests;

impl Cluster {
    /// Changes a pending job's time limit, nice or partition (Slurm's `scontrol update`). Its
    /// owner may only lower the time limit and may not set a negative nice; an admin may do
    /// anything the checks at submit allow. Logged with who, what and the old values.
    pub fn update(
        &mut self,
        caller: &Caller,
        id: JobId,
        req: &wharf_api::wire::UpdateRequest,
        now: u64,
    ) -> Result<JobRecord, Failure> {
        let running =
            (self.jobs.get(&id)).filter(|j| j.state.holds_resources() && caller.may_manage(j));
        if let Some(job) = running {
            let job = self.limit_changed(caller, job, req)?;
            self.commit(vec![job.clone()])?;
            return Ok(view(caller, job));
        }
        let job = self.pending_for(caller, id, "updated")?;
        let (job, moved) = self.updated(caller, job, req, now, &Batch::default())?;
        self.commit(vec![job.clone()])?;
        if moved {
            self.reserved.remove(&id);
        }
        Ok(view(caller, job))
    }

    /// Running (or starting) `job`, the caller's to manage, with the time limit `req` gives
    /// it, as Slurm's `scontrol update TimeLimit=` of a running job: its owner may lower it,
    /// an admin set it to anything; counted from the job's start, so a limit it has run past
    /// ends it at once (TIMEOUT). Its nodes take the new limit up from their next answer
    /// (see [`Cluster::limit_orders`]). Nothing else of a running job changes.
    pub(super) fn limit_changed(
        &self,
        caller: &Caller,
        job: &JobRecord,
        req: &wharf_api::wire::UpdateRequest,
    ) -> Result<JobRecord, Failure> {
        let id = job.id;
        let time =
            (req.new_time(job.time_limit)).map_err(|m| Failure::new(ErrorKind::InvalidInput, m))?;
        let Some(t) = time.filter(|_| req.only_time()) else {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!(
                    "job {id} is {}: only its time limit (--time) can be changed while it runs",
                    job.state
                ),
            ));
        };
        if job.cancel_requested || job.stop.is_some() {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!("job {id} is being stopped; its time limit no longer matters"),
            ));
        }
        let mut job = job.clone();
        let Some(spec) = job.spec.as_mut() else {
            return Err(Failure::new(
                ErrorKind::Internal,
                format!("job {id} has no spec"),
            ));
        };
        // Never less than it has for UNLIMITED: a MaxTime lowered since (or an admin's raise
        // past it) must not make it end the job.
        let (t, unlimited) = self.time_asked(caller, id, spec, t, job.time_limit, true)?;
        tracing::info!(
            job = id,
            by = %caller.owner.user,
            admin = caller.admin,
            old_time = job.time_limit,
            time = t,
            "running job's time limit changed"
        );
        spec.time_limit = t;
        spec.time_defaulted = false;
        spec.time_unlimited = unlimited;
        job.time_limit = t;
        Ok(job)
    }

    /// The time limit `t` asked of job `id` (whose `spec` it is, holding `current`), with
    /// whether it is `UNLIMITED` (its partition's MaxTime, never under `current` when
    /// `keep`), or why not: zero, or a raise by someone other than an admin.
    fn time_asked(
        &self,
        caller: &Caller,
        id: JobId,
        spec: &wharf_api::JobSpec,
        t: u64,
        current: u64,
        keep: bool,
    ) -> Result<(u64, bool), Failure> {
        let unlimited = t == wharf_api::UNLIMITED_TIME;
        let t = if unlimited {
            let part = wharf_core::cycle::partition(&self.sched, spec.partition.as_deref());
            let max = self.unlimited_time(part.ok().flatten());
            if keep {
                max.max(current)
            } else {
                max
            }
        } else {
            t
        };
        if t == 0 {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                "`time` must be greater than zero",
            ));
        }
        if t > current && !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                format!(
                    "only an admin may raise a time limit; job {}'s is {}, which you may lower",
                    self.jobs
                        .get(&id)
                        .map_or_else(|| id.to_string(), JobRecord::label),
                    wharf_api::resources::format_duration(current)
                ),
            ));
        }
        Ok((t, unlimited))
    }

    /// Orders for `node`'s agent to hold jobs to time limits changed since their launch:
    /// one for each job running there whose tasks, as `reported` (job, the limit they hold
    /// it to), hold it to another. A job the agent reports no limit for (an older agent, or
    /// one still launching) gets none.
    pub fn limit_orders(
        &self,
        node: &str,
        reported: &[(JobId, u64)],
    ) -> Vec<wharf_api::wire::LimitOrder> {
        reported
            .iter()
            .filter_map(|&(id, held)| {
                let job = self.jobs.get(&id)?;
                let rank = job.rank_on(node)? as usize;
                let live = job.state.holds_resources()
                    && !job.allocs[rank].ended()
                    && !job.cancel_requested
                    && job.stop.is_none();
                (live && held != job.time_limit).then_some(wharf_api::wire::LimitOrder {
                    id,
                    time_limit: job.time_limit,
                })
            })
            .collect()
    }

    /// `job` (pending, the caller's to manage) with the changes of `req`, or why they are
    /// refused; and whether it moved to another partition, QoS or account. Nothing is
    /// committed. `batch`: the other jobs changed with it (an array's tasks), so that its
    /// owner's caps count each of them once, as changed.
    pub(super) fn updated(
        &self,
        caller: &Caller,
        mut job: JobRecord,
        req: &wharf_api::wire::UpdateRequest,
        now: u64,
        batch: &Batch,
    ) -> Result<(JobRecord, bool), Failure> {
        let id = job.id;
        let Some(mut spec) = job.spec.clone() else {
            return Err(Failure::new(
                ErrorKind::Internal,
                format!("job {id} has no spec"),
            ));
        };
        let old = (
            spec.time_limit,
            spec.nice,
            spec.partition.clone(),
            spec.qos.clone(),
            spec.account.clone(),
            job.begin_time,
        );
        let time = (req.new_time(spec.time_limit))
            .map_err(|m| Failure::new(ErrorKind::InvalidInput, m))?;
        if let Some(t) = time {
            let (t, unlimited) = self.time_asked(caller, id, &spec, t, spec.time_limit, false)?;
            if t > self.defaults.max_time && !caller.admin {
                return Err(Failure::new(
                    ErrorKind::InvalidInput,
                    "`time` is over the site's maximum",
                ));
            }
            spec.time_limit = t;
            spec.time_defaulted = false;
            spec.time_unlimited = unlimited;
        }
        if let Some(n) = req.nice {
            if n.unsigned_abs() > wharf_api::job::MAX_NICE.unsigned_abs() {
                return Err(Failure::new(
                    ErrorKind::InvalidInput,
                    format!("`nice` {n} is out of range"),
                ));
            }
            spec.nice = n;
        }
        if let Some(p) = &req.partition {
            spec.partition = Some(p.trim().to_string());
            // What it took from the partition it leaves, it takes from the new one.
            self.partition_defaults(&mut spec)?;
        }
        if let Some(q) = &req.qos {
            spec.qos = Some(q.trim().to_string());
            spec.qos_by_admin = caller.admin;
            spec.qos_defaulted = false;
        }
        if let Some(a) = &req.account {
            spec.account = Some(a.trim().to_string());
        }
        let old_priority = spec.priority;
        if let Some(p) = req.priority {
            if !caller.admin {
                return Err(Failure::new(
                    ErrorKind::PermissionDenied,
                    "only an admin may fix a job's priority; lower your own job's with --nice",
                ));
            }
            spec.priority = (p > 0).then_some(p);
        }
        let old_name = job.name.clone();
        if let Some(name) = &req.name {
            wharf_api::job::check_job_name(name)
                .map_err(|m| Failure::new(ErrorKind::InvalidInput, m))?;
            spec.name = name.clone();
            job.name = name.clone();
        }
        let old_dependency = job.dependency.clone();
        if let Some(text) = &req.dependency {
            job.dependency = self.new_dependency(caller, &job, text, batch)?;
            // What the last pass said of the old one (waiting on a job, or never met) no
            // longer holds; the next pass decides the new one.
            let said = job.pending_reason.as_ref();
            if said.is_some_and(PendingReason::is_dependency) {
                job.pending_reason = None;
                job.reason = Some("Queued: dependency changed; waiting for the scheduler".into());
            }
        }
        if req.name.is_some() || req.dependency.is_some() {
            self.check_circle(&job, batch, req.dependency.is_some())?;
        }
        let owner = Caller {
            owner: job.owner.clone(),
            admin: caller.admin,
        };
        self.check_partition(&spec, &owner)?;
        // Of what an update may change, only the partition changes which nodes could hold it.
        if req.partition.is_some() {
            let nodes = self.node_checks(&spec, &job.owner.user);
            nodes.selection?;
            nodes.shape?;
        }
        // What an admin set before is not the caller's to answer for; a QoS is, under the
        // account the job moves to.
        // The account first, as at submit: a QoS is judged under an account the user is in.
        self.check_account(&spec, &job.owner.user)?;
        let check = super::sched::Checked {
            qos: req.qos.is_some() || req.account.is_some(),
            nice: req.nice.is_some(),
        };
        if check.qos || check.nice {
            self.check_qos_and_nice(&spec, caller, &job.owner.user, check)?;
        }
        // The job is among its owner's active jobs already: it is not counted twice.
        if batch.ids.is_empty() {
            self.check_limits(&spec, &job.owner, &[], 1, &BTreeSet::from([id]))?;
        } else {
            // The batch's caps are checked once, with every job as changed (`check_batch_caps`).
            self.check_job_limits(&spec, &job.owner)?;
        }
        job.time_limit = spec.time_limit;
        job.resources = spec.resources;
        if let Some(b) = req.begin {
            let at = b
                .checked_at(now)
                .map_err(|e| Failure::new(ErrorKind::InvalidInput, e))?;
            job.begin_time = Some(at).filter(|&t| t > now);
        }
        tracing::info!(
            job = id,
            by = %caller.owner.user,
            admin = caller.admin,
            old_time = old.0,
            old_nice = old.1,
            old_partition = ?old.2,
            old_qos = ?old.3,
            old_account = ?old.4,
            old_begin = ?old.5,
            old_priority = ?old_priority,
            old_name = %old_name,
            old_dependency = ?old_dependency.map(|d| d.to_string()),
            time = spec.time_limit,
            nice = spec.nice,
            partition = ?spec.partition,
            qos = ?spec.qos,
            account = ?spec.account,
            begin = ?job.begin_time,
            priority = ?spec.priority,
            name = %job.name,
            dependency = ?job.dependency.as_ref().map(|d| d.to_string()),
            "job updated"
        );
        // A job moved to another partition, QoS or account is ranked afresh there: a
        // reservation it kept where it was does not carry over.
        let spec_now = (&spec.partition, &spec.qos, &spec.account);
        let moved = spec_now != (&old.2, &old.3, &old.4);
        job.spec = Some(spec);
        Ok((job, moved))
    }
}

impl Cluster {
    /// The dependency `text` gives `job` (empty: none), or why it is refused: it does not
    /// parse, or names a job that does not exist or is another user's (as at submit).
    fn new_dependency(
        &self,
        caller: &Caller,
        job: &JobRecord,
        text: &str,
        batch: &Batch,
    ) -> Result<Option<Dependency>, Failure> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let dep = wharf_api::dependency::parse_dependency(text)
            .map_err(|m| Failure::new(ErrorKind::InvalidInput, format!("--dependency: {m}")))?;
        // An array's tasks take the same dependency: the first checks it for all of them.
        if batch.ids.first().is_none_or(|&first| first == job.id) {
            self.check_dependency(Some(&dep), caller)?;
        }
        Ok(Some(dep))
    }
}

impl Cluster {
    /// Refuses `job`, as an update leaves its name and dependency (`new_dep`: the update
    /// gives one), when it would wait on itself (see [`Cluster::circle`]); for an array's
    /// tasks (`batch`), the first checks for all, each with its own dependency unless the
    /// update gives one, so an update costs one walk, not one a task.
    fn check_circle(&self, job: &JobRecord, batch: &Batch, new_dep: bool) -> Result<(), Failure> {
        if batch.ids.first().is_some_and(|&first| first != job.id) {
            return Ok(());
        }
        let one = BTreeSet::from([job.id]);
        let ids = if batch.ids.is_empty() {
            &one
        } else {
            &batch.ids
        };
        let Some(through) = self.circle(&circle::ours(job, ids, new_dep)) else {
            return Ok(());
        };
        let through = self.job_label(through);
        Err(Failure::new(
            ErrorKind::InvalidInput,
            format!(
                "this would make job {} wait on itself, through job {through} (which waits, \
                 through its dependencies, on it), and it would never start; name another \
                 job, or change {through}'s dependency or name first",
                self.job_label(job.id)
            ),
        ))
    }
}

/// Jobs changed together by one update (an array's tasks): their ids. Their owner's caps are
/// checked once for all of them ([`Cluster::check_batch_caps`]), not job by job.
#[derive(Debug, Default)]
pub(super) struct Batch {
    pub ids: BTreeSet<JobId>,
}

impl Cluster {
    /// Refuses `changed` (one owner's jobs, as an update leaves them, the ids of `batch`) when
    /// they would take the owner over a submit cap: each (association, QoS) they count toward
    /// is checked once, with all of them counted as changed and none as they were.
    pub(super) fn check_batch_caps(
        &self,
        batch: &Batch,
        changed: &[JobRecord],
    ) -> Result<(), Failure> {
        let Some(owner) = changed.first().map(|j| &j.owner) else {
            return Ok(());
        };
        let counted: Vec<(wharf_core::Assoc, Option<String>)> = changed
            .iter()
            .map(|j| (self.assoc(j), self.qos_of(j.spec.as_ref())))
            .collect();
        let distinct: BTreeSet<&(wharf_core::Assoc, Option<String>)> = counted.iter().collect();
        for this in distinct {
            // Every changed job but one of this kind before it: the check adds that one.
            let at = counted.iter().position(|c| c == this).unwrap_or(0);
            let mut earlier = counted.clone();
            earlier.remove(at);
            self.check_caps(owner, this, &earlier, 1, &batch.ids)?;
        }
        Ok(())
    }
}
