//! Signals for the processes of running jobs and steps on this node (`wharf cancel
//! --signal`): the controller's orders passed on to the tasks' shims (see
//! [`wharf_runtime::signals`]), and what the report says was passed on.
//!
//! Each job's newest order passed on is recorded in its first task's directory here, so
//! that an order repeated (a lost answer, an agent restart) is passed on once.

use wharf_api::signal::{Reach, SignalOrder, Signalled};
use wharf_api::wire::AgentJob;
use wharf_runtime::signals::{self, Request};
use wharf_runtime::{Backend, JobDir};

use crate::AgentConfig;

/// For each running job in `jobs`, the newest signal order passed on here.
pub fn report(cfg: &AgentConfig, jobs: &[AgentJob]) -> Vec<Signalled> {
    (jobs.iter())
        .filter(|j| j.exit.is_none() && j.start_time.is_some())
        .map(|j| Signalled {
            job: j.id,
            seq: signals::passed_on(&crate::launch::task_dir(&cfg.state_dir, j.id, 0)),
        })
        .collect()
}

/// Passes `order` on to the tasks here it reaches, unless it was already. Recorded as passed
/// on even when no task here takes it (it reaches none of this node's, or they are ending):
/// a repeat would find them no different.
pub fn pass_on(cfg: &AgentConfig, launcher: &dyn Backend, order: &SignalOrder) {
    let first = crate::launch::task_dir(&cfg.state_dir, order.job, 0);
    if !first.path().is_dir() || signals::passed_on(&first) >= order.seq {
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
        tracing::warn!(job = order.job, error = %e, "cannot record a signal passed on");
    }
}
