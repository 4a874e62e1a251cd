//! Who waits on which job's state: `GET /v1/jobs/{id}/wait` is answered the moment the job
//! leaves the state its caller knows, not at the next look of a polling client.
//!
//! The cluster tells [`JobWatch::changed`] of every job it commits; a waiter holds a
//! [`tokio::sync::watch::Receiver`] of what it sees of its job ([`Seen`]), made under the
//! cluster's lock together with the first read of the job, so that no change falls between
//! the two. The record committed with each change comes with it: a woken waiter answers from
//! it, without taking the cluster's lock again (or reading the store, once the job ended).
//!
//! ```
//! use wharf_api::{JobRecord, JobState, Owner, Resources};
//! use wharf_controller::watch::JobWatch;
//! let mut watch = JobWatch::default();
//! let mut rx = watch.subscribe(7, JobState::Pending);
//! let owner = Owner { uid: 1000, gid: 1000, user: "ann".into() };
//! let one_cpu = Resources { cpus: 1, memory: 1 << 30, gpus: 0 };
//! let mut job = JobRecord::pending(owner, "train".into(), one_cpu, 60, 0);
//! (job.id, job.state) = (7, JobState::Running);
//! watch.changed(&job);
//! let seen = rx.borrow_and_update().clone();
//! assert_eq!(seen.state, JobState::Running);
//! assert_eq!(seen.record.map(|r| r.state), Some(JobState::Running));
//! // An ended job's entry goes; its waiters see the last state, then the sender's end.
//! job.state = JobState::Completed;
//! watch.changed(&job);
//! assert_eq!(watch.len(), 0);
//! assert_eq!(rx.borrow_and_update().state, JobState::Completed);
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;
use wharf_api::{JobId, JobRecord, JobState};

/// What a waiter sees of its job.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The job's state.
    pub state: JobState,
    /// The record committed with that state; `None` until the job's first committed change
    /// since someone began to wait on it in this state.
    pub record: Option<Arc<JobRecord>>,
}

/// What each job someone waits on is now.
#[derive(Debug, Default)]
pub struct JobWatch {
    senders: BTreeMap<JobId, watch::Sender<Seen>>,
}

impl JobWatch {
    /// A receiver of job `id`'s changes; the job is in `state` now.
    pub fn subscribe(&mut self, id: JobId, state: JobState) -> watch::Receiver<Seen> {
        let sender = self.senders.entry(id).or_insert_with(|| {
            watch::Sender::new(Seen {
                state,
                record: None,
            })
        });
        sender.send_if_modified(|seen| {
            let moved = seen.state != state;
            if moved {
                *seen = Seen {
                    state,
                    record: None,
                };
            }
            moved
        });
        sender.subscribe()
    }

    /// `job` was committed: its waiters are woken if its state changed (and see the record
    /// either way). The entry goes once the job has ended or nobody waits on it any more.
    pub fn changed(&mut self, job: &JobRecord) {
        let Some(sender) = self.senders.get(&job.id) else {
            return;
        };
        if sender.receiver_count() > 0 {
            sender.send_if_modified(|seen| {
                let moved = seen.state != job.state;
                *seen = Seen {
                    state: job.state,
                    record: Some(Arc::new(job.clone())),
                };
                moved
            });
        }
        if job.state.is_terminal() || sender.receiver_count() == 0 {
            self.senders.remove(&job.id);
        }
    }

    /// How many jobs are waited on.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// True when nobody waits on any job.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_nobody_waits_on_are_dropped_at_the_next_change() {
        let mut watch = JobWatch::default();
        let rx = watch.subscribe(1, JobState::Pending);
        drop(rx);
        watch.changed(&job(1, JobState::Starting));
        assert!(watch.is_empty());
        // A change of a job nobody waits on costs nothing.
        watch.changed(&job(2, JobState::Running));
        assert!(watch.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_wakes_on_a_change_of_state_only() {
        let mut watch = JobWatch::default();
        let mut rx = watch.subscribe(3, JobState::Starting);
        watch.changed(&job(3, JobState::Starting));
        assert!(!rx.has_changed().unwrap());
        let mut running = job(3, JobState::Running);
        running.start_time = Some(1_000);
        watch.changed(&running);
        tokio::time::timeout(std::time::Duration::from_secs(5), rx.changed())
            .await
            .expect("woken")
            .expect("sender alive");
        let seen = rx.borrow().clone();
        assert_eq!(seen.state, JobState::Running);
        // The record as committed with the change, for the waiter to answer with.
        assert_eq!(seen.record.and_then(|r| r.start_time), Some(1_000));
    }

    #[test]
    fn a_second_waiter_in_the_same_state_keeps_the_record_the_first_was_woken_with() {
        let mut watch = JobWatch::default();
        let mut first = watch.subscribe(4, JobState::Pending);
        watch.changed(&job(4, JobState::Running));
        assert!(first.has_changed().unwrap());
        let second = watch.subscribe(4, JobState::Running);
        assert!(!first.has_changed().unwrap() || first.borrow_and_update().record.is_some());
        assert_eq!(second.borrow().state, JobState::Running);
        assert!(second.borrow().record.is_some());
        // A waiter that read an older state resets what is seen: the record is not the
        // state's any more.
        let third = watch.subscribe(4, JobState::Pending);
        assert_eq!(third.borrow().state, JobState::Pending);
        assert!(third.borrow().record.is_none());
    }

    fn job(id: JobId, state: JobState) -> JobRecord {
        let mut job = crate::store::tests::record();
        (job.id, job.state) = (id, state);
        job
    }
}
