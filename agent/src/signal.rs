//! Signals for the processes of running jobs and steps on this node (`wharf cancel
//! --signal`): the controller's orders passed on to the tasks' shims (see
//! [`wharf_runtime::signals`]), and what the report says was passed on.
//!
//! Each job's newest order passed on is recorded in its first task's directory here, so
//! that an order repeated (a lost answer, an agent restart) is passed on once; and in
//! memory ([`Passed`]), so that a record that cannot be written (a full disk) does not have
//! the controller repeat the order at every poll, and each task take it again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use wharf_api::signal::{Reach, SignalOrder, Signalled};
use wharf_api::wire::AgentJob;
use wharf_api::JobId;
use wharf_runtime::signals::{self, Request};
use wharf_runtime::{Backend, JobDir};

use crate::AgentConfig;

/// The newest signal order passed on to each job's tasks in this agent's run, beside the
/// record on disk. Shared by the poll loop and the thread that carries out the orders.
#[derive(Debug, Clone, Default)]
pub struct Passed(Arc<Mutex<BTreeMap<JobId, u64>>>);

impl Passed {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<JobId, u64>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest order passed on to `job` here: what this run remembers, or, for a job it
    /// has not looked at yet, the record on disk (from before a restart), read once.
    fn newest(&self, cfg: &AgentConfig, job: JobId) -> u64 {
        let mut passed = self.lock();
        *passed
            .entry(job)
            .or_insert_with(|| signals::passed_on(&crate::launch::task_dir(&cfg.state_dir, job, 0)))
    }

    /// For each running job in `jobs`, the newest signal order passed on here. Jobs no longer
    /// in `jobs` are forgotten.
    pub fn report(&self, cfg: &AgentConfig, jobs: &[AgentJob]) -> Vec<Signalled> {
        let here: std::collections::BTreeSet<JobId> = jobs.iter().map(|j| j.id).collect();
        self.lock().retain(|id, _| here.contains(id));
        (jobs.iter())
            .filter(|j| j.exit.is_none() && j.start_time.is_some())
            .map(|j| Signalled {
                job: j.id,
                seq: self.newest(cfg, j.id),
            })
            .collect()
    }

    /// Passes `order` on (see [`pass_on`]) unless it was already, and remembers it.
    pub fn pass_on(&self, cfg: &AgentConfig, launcher: &dyn Backend, order: &SignalOrder) {
        if self.newest(cfg, order.job) >= order.seq {
            return;
        }
        // Remembered even when the job has no task here: a repeat would find it the same,
        // and the controller would answer every poll at once with it.
        pass_on(cfg, launcher, order);
        let mut passed = self.lock();
        let seq = passed.entry(order.job).or_default();
        *seq = (*seq).max(order.seq);
    }
}

/// Passes `order` on to the tasks here it reaches, if the job has any here. Recorded as
/// passed on even when no task here takes it (it reaches none of this node's, or they are
/// ending): a repeat would find them no different.
fn pass_on(cfg: &AgentConfig, launcher: &dyn Backend, order: &SignalOrder) {
    let first = crate::launch::task_dir(&cfg.state_dir, order.job, 0);
    if !first.path().is_dir() {
        return;
    }
    let req = Request {
        signal: order.signal,
        script_only: order.reach == Reach::Batch,
    };
    let dirs: Vec<JobDir> = match order.reach {
        Reach::Job => (crate::task_dirs(&cfg.state_dir, order.job).into_iter())
            .chain(crate::step::dirs_of(cfg, order.job, None))
            .collect(),
        Reach::Steps => crate::step::dirs_of(cfg, order.job, None),
        Reach::Step(step) => crate::step::dirs_of(cfg, order.job, Some(step)),
        Reach::Batch => vec![first.clone()],
    };
    let mut sent = 0;
    for dir in dirs {
        match signals::request(&dir, order.seq, req) {
            Ok(true) => {
                launcher.signals_requested(&dir);
                sent += 1;
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(
                job = order.job,
                dir = %dir.path().display(),
                error = %e,
                "cannot pass a signal on to a task"
            ),
        }
    }
    tracing::info!(
        job = order.job,
        signal = order.signal,
        reach = ?order.reach,
        tasks = sent,
        "signal passed on"
    );
    if let Err(e) = signals::record_passed_on(&first, order.seq) {
        // The controller repeats the order; the tasks' shims take it again.
        // Remembered in memory for this run (see [`Passed`]); after a restart the tasks
        // may take it again.
        tracing::warn!(job = order.job, error = %e, "cannot record a signal passed on");
    }
}

#[cfg(test)]
mod tests {
    use wharf_runtime::fake::{FakeBackend, FakeCall};

    use super::*;

    #[test]
    fn an_order_is_passed_on_once_even_when_its_record_cannot_be_written() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = crate::launch::tests::cfg(tmp.path());
        let first = crate::launch::task_dir(&cfg.state_dir, 7, 0);
        std::fs::create_dir_all(first.signal_requests()).unwrap();
        // The record's name taken by a directory that is not empty: it cannot be written.
        std::fs::create_dir_all(first.signalled().join("x")).unwrap();
        let fake = FakeBackend::new();
        let passed = Passed::default();
        let order = SignalOrder {
            job: 7,
            seq: 1,
            signal: 10,
            reach: Reach::Job,
        };
        let job = AgentJob {
            id: 7,
            start_time: Some(1),
            exit: None,
            end_time: None,
            stopping: false,
            ready: true,
            time_limit: None,
        };
        for _ in 0..3 {
            passed.pass_on(&cfg, &fake, &order);
            // What the poll reports: the order is not asked for again.
            let report = passed.report(&cfg, std::slice::from_ref(&job));
            assert_eq!(report, vec![Signalled { job: 7, seq: 1 }]);
        }
        let woken = (fake.calls().iter())
            .filter(|c| matches!(c, FakeCall::SignalsRequested(_)))
            .count();
        assert_eq!(woken, 1, "{:?}", fake.calls());
        // Once the job is gone from the report, it is forgotten.
        assert!(passed.report(&cfg, &[]).is_empty());
        assert!(passed.lock().is_empty());
    }
}
