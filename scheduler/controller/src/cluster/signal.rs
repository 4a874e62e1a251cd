//! Signals sent to running jobs and steps without ending them (`wharf cancel --signal`): the
//! requests the job's record keeps, and the orders that carry them to its nodes (see
//! [`wharf_api::signal`]).

use nix::sys::signal::Signal;
use wharf_api::signal::{JobSignal, Reach, SignalOrder, SignalRequest, Signalled};
use wharf_api::step::StepRecord;
use wharf_api::wire::ErrorKind;
use wharf_api::{JobId, JobRecord, JobState};

use super::{not_yours, Caller, Cluster, Failure};

/// Why `n` is no signal a job may be sent, if it is none.
fn check_signal(n: i32) -> Result<(), Failure> {
    match Signal::try_from(n) {
        Ok(_) => Ok(()),
        Err(_) => Err(Failure::new(
            ErrorKind::InvalidInput,
            format!("{n} is not a signal number (`kill -l` lists them: 10 is SIGUSR1)"),
        )),
    }
}

/// Why `job` cannot be signalled now (the caller may manage it), if it cannot: only a job
/// that runs and is not being stopped has processes to take a signal and stay.
fn not_signallable(job: &JobRecord) -> Option<Failure> {
    if job.state == JobState::Running && !job.cancel_requested && job.stop.is_none() {
        return None;
    }
    let label = job.label();
    let why = match job.state {
        JobState::Running => {
            format!("job {label} is already stopping; its processes take no more signals")
        }
        JobState::Pending => format!(
            "job {label} is PENDING, not running: it has no processes to signal yet (cancel it \
             without --signal, or signal it once it runs)"
        ),
        JobState::Starting => format!(
            "job {label} is STARTING, not running yet: signal it once `wharf queue` shows it \
             RUNNING"
        ),
        ended => format!("job {label} has already ended ({ended})"),
    };
    Some(Failure::new(ErrorKind::Conflict, why))
}

/// `job`'s signals of its current run numbered after `seq`: those a node that reported `seq`
/// passed on has yet to.
fn after(job: &JobRecord, seq: u64) -> impl Iterator<Item = &JobSignal> {
    (job.signals.iter()).filter(move |s| s.run == job.restarts && s.seq > seq)
}

/// Records `signal` sent by `by` to `job`'s current run, keeping the newest
/// [`JobSignal::KEPT`] (see [`Cluster::check_backlog`] for why none is dropped unsent).
fn record(job: &mut JobRecord, signal: i32, reach: Reach, by: &str) {
    let seq = job.signals.last().map_or(0, |s| s.seq) + 1;
    let sent = JobSignal {
        seq,
        run: job.restarts,
        signal,
        reach,
        by: by.to_string(),
    };
    job.signals.push(sent);
    let over = job.signals.len().saturating_sub(JobSignal::KEPT);
    job.signals.drain(..over);
}

impl Cluster {
    /// Refuses a signal to `job` while [`JobSignal::KEPT`] of its current run's signals are
    /// not yet passed on by every node that runs a task of it, as their agents last
    /// reported: the record keeps only that many, so another would drop one the caller was
    /// told was sent. A caller that sends faster than the nodes pass them on is told to wait.
    /// Only nodes whose last report lists the job count: a node whose rank has ended (or whose
    /// agent is too old to report signals) takes none anyway, and must not hold the others
    /// back for the rest of the run. While no node lists it (just after a controller start,
    /// until the next polls), none is taken as passed on.
    fn check_backlog(&self, job: &JobRecord) -> Result<(), Failure> {
        let floor = (job.nodes())
            .filter_map(|node| self.signals_passed.get(node)?.get(&job.id).copied())
            .min()
            .unwrap_or(0);
        let waiting = after(job, floor).count();
        if waiting < JobSignal::KEPT {
            return Ok(());
        }
        Err(Failure::new(
            ErrorKind::Unavailable,
            format!(
                "job {} has {waiting} signals its nodes have not passed on yet: send this one \
                 again in a moment",
                job.label()
            ),
        ))
    }

    /// Sends `req`'s signal to running job `id`'s processes for `caller` (its owner or an
    /// admin), which go on running unless the signal ends them. Returns the job as the
    /// caller sees it and the nodes to wake.
    ///
    /// Errors: `NotFound` for no such job, `PermissionDenied` for another user's job,
    /// `InvalidInput` for a number that is no signal or `-b` for a job with no batch script,
    /// `Conflict` for a job that is not running (pending, starting, stopping or ended).
    pub fn signal(
        &mut self,
        caller: &Caller,
        id: JobId,
        req: SignalRequest,
    ) -> Result<(JobRecord, Vec<String>), Failure> {
        check_signal(req.signal)?;
        let Some(job) = self.jobs.get(&id) else {
            return match self.store.job(id)? {
                Some(j) if !caller.may_manage(&j) => Err(not_yours(id)),
                Some(j) => Err(not_signallable(&j).unwrap_or_else(|| {
                    Failure::new(ErrorKind::Conflict, format!("job {id} has ended"))
                })),
                None => Err(Failure::new(ErrorKind::NotFound, format!("no job {id}"))),
            };
        };
        if !caller.may_manage(job) {
            return Err(not_yours(id));
        }
        if let Some(refused) = not_signallable(job) {
            return Err(refused);
        }
        if req.batch && !job.runs_once() {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                format!(
                    "job {} runs no batch script (its command runs as every task): drop -b \
                     to signal its tasks",
                    job.label()
                ),
            ));
        }
        let mut jobs = [job.clone()];
        let wake = self.record_each(caller, &mut jobs, req)?;
        let [job] = jobs;
        self.commit(vec![job.clone()])?;
        Ok((crate::visibility::view(caller, job), wake))
    }

    /// Records `req`'s signal in each of `jobs` (running, checked), once none has too many
    /// waiting ([`Cluster::check_backlog`]); returns the nodes to wake, each once.
    fn record_each(
        &self,
        caller: &Caller,
        jobs: &mut [JobRecord],
        req: SignalRequest,
    ) -> Result<Vec<String>, Failure> {
        for job in jobs.iter() {
            self.check_backlog(job)?;
        }
        let mut wake = Vec::new();
        for job in jobs {
            let reach = req.reach(job.runs_once());
            record(job, req.signal, reach, &caller.owner.user);
            wake.extend(job.nodes().map(str::to_string));
        }
        wake.sort();
        wake.dedup();
        Ok(wake)
    }

    /// [`Cluster::signal`] for every running task of array `array_id` (`wharf cancel
    /// --signal` with the array's job id, as scancel's), in one transaction. `None` when
    /// `array_id` is no array; returns the first task signalled, as the caller sees it, and
    /// the nodes to wake.
    ///
    /// Errors: as [`Cluster::signal`]'s, and `Conflict` when no task of the array runs.
    pub fn signal_array(
        &mut self,
        caller: &Caller,
        array_id: JobId,
        req: SignalRequest,
    ) -> Result<Option<(JobRecord, Vec<String>)>, Failure> {
        check_signal(req.signal)?;
        let Some(tasks) = self.active_tasks(caller, array_id)? else {
            return Ok(None);
        };
        let mut running: Vec<JobRecord> = tasks
            .into_iter()
            .filter(|j| not_signallable(j).is_none())
            .collect();
        if running.is_empty() {
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!(
                    "no task of array job {array_id} is running: only running tasks can be \
                     signalled"
                ),
            ));
        }
        if req.batch && running.iter().any(|j| !j.runs_once()) {
            return Err(Failure::new(
                ErrorKind::InvalidInput,
                format!("array job {array_id} runs no batch script: drop -b to signal its tasks"),
            ));
        }
        let wake = self.record_each(caller, &mut running, req)?;
        let first = self.commit_tasks(caller, running)?;
        Ok(Some((first, wake)))
    }

    /// Sends `signal` to the processes of step `step` of running job `id` for `caller` (`wharf
    /// cancel --signal SIG ID.STEP`). Returns the step and the nodes to wake.
    ///
    /// Errors: as [`Cluster::signal`]'s, `NotFound` for no such step and `Conflict` for a
    /// step that has ended or is stopping.
    pub fn signal_step(
        &mut self,
        caller: &Caller,
        id: JobId,
        step: u32,
        signal: i32,
    ) -> Result<(StepRecord, Vec<String>), Failure> {
        check_signal(signal)?;
        let job = self.active_for_steps(caller, id)?;
        if let Some(refused) = not_signallable(job) {
            return Err(refused);
        }
        let label = job.label();
        let Some(found) = job.steps.iter().find(|s| s.id == step) else {
            return Err(Failure::new(
                ErrorKind::NotFound,
                format!(
                    "job {label} has no step {step} (it has had {})",
                    job.steps.len()
                ),
            ));
        };
        if found.exit.is_some() || found.stop.is_some() {
            let how = match &found.exit {
                Some(_) => format!("has ended ({})", found.state()),
                None => "is already stopping".to_string(),
            };
            return Err(Failure::new(
                ErrorKind::Conflict,
                format!("step {label}.{step} {how}: only a running step can be signalled"),
            ));
        }
        self.check_backlog(job)?;
        let found = found.clone();
        let wake = found.nodes.iter().map(|n| n.node.clone()).collect();
        let mut job = job.clone();
        record(&mut job, signal, Reach::Step(step), &caller.owner.user);
        self.commit(vec![job])?;
        Ok((found, wake))
    }

    /// Takes `node`'s poll's report of the newest signal it passed on for each job it runs,
    /// in place of the one before ([`Cluster::check_backlog`]). Once per poll, not at each
    /// wake of its wait.
    pub fn signals_reported(&mut self, node: &str, reported: &[Signalled]) {
        let passed = reported.iter().map(|s| (s.job, s.seq)).collect();
        match self.signals_passed.get_mut(node) {
            Some(before) => *before = passed,
            None => {
                self.signals_passed.insert(node.to_string(), passed);
            }
        }
    }

    /// Orders for `node`'s agent to pass on the signals of the jobs it runs that it has not
    /// yet, as `reported`: each of the job's current run newer than the report's, a job being
    /// stopped's too (they were taken before the stop). A job the agent reports nothing for
    /// (an older agent) gets none.
    pub fn signal_orders(&self, node: &str, reported: &[Signalled]) -> Vec<SignalOrder> {
        let mut out = Vec::new();
        for seen in reported {
            let Some(job) = self.jobs.get(&seen.job) else {
                continue;
            };
            // Signals taken before a cancel or a preemption still go: the agent passes them
            // on before the kill given with them, as `scancel -s USR1` then `scancel` would
            // (a checkpoint asked for, then the end). New ones are refused by then.
            if job.state != JobState::Running || job.rank_on(node).is_none() {
                continue;
            }
            out.extend(after(job, seen.seq).map(|s| SignalOrder {
                job: job.id,
                seq: s.seq,
                signal: s.signal,
                reach: s.reach,
            }));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running() -> JobRecord {
        JobRecord {
            id: 4,
            state: JobState::Running,
            ..crate::store::tests::record()
        }
    }

    #[test]
    fn signals_are_numbered_in_sequence_and_only_the_newest_kept() {
        let mut job = running();
        for _ in 0..JobSignal::KEPT + 3 {
            record(&mut job, 10, Reach::Job, "alice");
        }
        assert_eq!(job.signals.len(), JobSignal::KEPT);
        assert_eq!(job.signals.first().unwrap().seq, 4);
        assert_eq!(job.signals.last().unwrap().seq, JobSignal::KEPT as u64 + 3);
        job.restarts = 1;
        record(&mut job, 12, Reach::Steps, "bob");
        let next = job.signals.last().unwrap();
        assert_eq!((next.seq, next.run, next.by.as_str()), (20, 1, "bob"));
    }

    #[test]
    fn only_a_running_job_not_being_stopped_takes_a_signal() {
        let mut job = running();
        assert!(not_signallable(&job).is_none());
        job.cancel_requested = true;
        assert!(not_signallable(&job).unwrap().message.contains("stopping"));
        for (state, says) in [
            (JobState::Pending, "PENDING"),
            (JobState::Starting, "STARTING"),
            (JobState::Completed, "ended (COMPLETED)"),
        ] {
            let job = JobRecord { state, ..running() };
            let refused = not_signallable(&job).unwrap();
            assert_eq!(refused.kind, ErrorKind::Conflict);
            assert!(refused.message.contains(says), "{}", refused.message);
        }
    }

    /// SIGUSR1 to a job's tasks.
    const USR1: SignalRequest = SignalRequest {
        signal: 10,
        batch: false,
        full: false,
    };

    /// A cluster of `n` nodes running one job of ann's on all of them (with the directory
    /// its store is in).
    fn running_on(n: u32) -> (tempfile::TempDir, Cluster, JobId, Caller) {
        use crate::cluster::steps::tests::{nodes, running};
        let dir = tempfile::tempdir().unwrap();
        let mut c = nodes(&dir, n);
        let id = running(&mut c, n);
        let ann = crate::cluster::sched::tests::caller(1000, "ann");
        (dir, c, id, ann)
    }

    /// A caller that sends faster than the nodes pass signals on is told to wait instead of
    /// having the record drop one it was told was sent; the nodes' reports free room.
    #[test]
    fn no_signal_is_dropped_before_every_node_passed_it_on() {
        let (_dir, mut c, id, ann) = running_on(2);
        for _ in 0..JobSignal::KEPT {
            c.signal(&ann, id, USR1).unwrap();
        }
        let refused = c.signal(&ann, id, USR1).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::Unavailable, "{}", refused.message);
        assert!(
            refused
                .message
                .contains("16 signals its nodes have not passed on"),
            "{}",
            refused.message
        );
        let kept = |c: &Cluster| c.jobs.get(&id).unwrap().signals.clone();
        assert_eq!(kept(&c).len(), JobSignal::KEPT);
        assert_eq!(kept(&c)[0].seq, 1, "the first is still there to pass on");
        // g1 passed all on, g2 only the first 4: 12 still wait on g2, so 4 more fit.
        let seen = |seq| [Signalled { job: id, seq }];
        c.signals_reported("g1", &seen(16));
        c.signals_reported("g2", &seen(4));
        assert_eq!(c.signal_orders("g1", &seen(16)).len(), 0);
        assert_eq!(c.signal_orders("g2", &seen(4)).len(), 12);
        for _ in 0..4 {
            c.signal(&ann, id, USR1).unwrap();
        }
        assert_eq!(
            c.signal(&ann, id, USR1).unwrap_err().kind,
            ErrorKind::Unavailable
        );
        assert_eq!(
            kept(&c)[0].seq,
            5,
            "only ones both nodes passed on were dropped"
        );
        c.signals_reported("g2", &seen(20));
        c.signal(&ann, id, USR1).unwrap();
        // A node whose rank has ended lists the job no more and holds no one back: once g1
        // (at 16) stops listing it, only g2's report (20) counts.
        for _ in 0..11 {
            c.signal(&ann, id, USR1).unwrap();
        }
        assert_eq!(
            c.signal(&ann, id, USR1).unwrap_err().kind,
            ErrorKind::Unavailable
        );
        c.signals_reported("g1", &[]);
        c.signal(&ann, id, USR1).unwrap();
    }

    /// `wharf cancel --signal USR1 J` then `wharf cancel J` before the node heard of the
    /// first: the signal still goes, in the same answer as the kill, and no new one is taken.
    #[test]
    fn a_signal_taken_before_a_cancel_is_still_passed_on() {
        let (_dir, mut c, id, ann) = running_on(1);
        c.signal(&ann, id, USR1).unwrap();
        c.cancel(&ann, id, 5_000).unwrap();
        let orders = c.signal_orders("g1", &[Signalled { job: id, seq: 0 }]);
        assert_eq!(orders.len(), 1, "{orders:?}");
        assert_eq!((orders[0].seq, orders[0].signal), (1, 10));
        let refused = c.signal(&ann, id, USR1).unwrap_err();
        assert!(refused.message.contains("stopping"), "{}", refused.message);
    }

    #[test]
    fn signal_numbers_are_checked() {
        assert!(check_signal(10).is_ok());
        assert!(check_signal(9).is_ok());
        for bad in [0, -1, 1000] {
            assert_eq!(check_signal(bad).unwrap_err().kind, ErrorKind::InvalidInput);
        }
    }
}
