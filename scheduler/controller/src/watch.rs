//! Who waits on which job's state: `GET /v1/jobs/{id}/wait` is answered the moment the job
//! leaves the state its caller knows, not at the next look of a polling client.
//!
//! The cluster tells [`JobWatch::changed`] of every job it commits; a waiter holds a
//! [`tokio::sync::watch::Receiver`] of its job's state, made under the cluster's lock together
//! with the first read of the job, so that no change falls between the two.
//!
//! ```
//! use wharf_api::JobState;
//! use wharf_controller::watch::JobWatch;
//! let mut watch = JobWatch::default();
//! let mut rx = watch.subscribe(7, JobState::Pending);
//! watch.changed(7, JobState::Running);
//! assert_eq!(*rx.borrow_and_update(), JobState::Running);
//! // An ended job's entry goes; its waiters see the last state, then the sender's end.
//! watch.changed(7, JobState::Completed);
//! assert_eq!(watch.len(), 0);
//! assert_eq!(*rx.borrow_and_update(), JobState::Completed);
//! ```

use std::collections::BTreeMap;

use tokio::sync::watch;
use wharf_api::{JobId, JobState};

/// The state of each job someone waits on.
#[derive(Debug, Default)]
pub struct JobWatch {
    senders: BTreeMap<JobId, watch::Sender<JobState>>,
}

impl JobWatch {
    /// A receiver of job `id`'s state, which is `state` now.
    pub fn subscribe(&mut self, id: JobId, state: JobState) -> watch::Receiver<JobState> {
        let sender = self
            .senders
            .entry(id)
            .or_insert_with(|| watch::Sender::new(state));
        sender.send_replace(state);
        sender.subscribe()
    }

    /// Job `id` is now in `state`: its waiters are woken. The entry goes once the job has
    /// ended or nobody waits on it any more.
    pub fn changed(&mut self, id: JobId, state: JobState) {
        let Some(sender) = self.senders.get(&id) else {
            return;
        };
        sender.send_if_modified(|known| std::mem::replace(known, state) != state);
        if state.is_terminal() || sender.receiver_count() == 0 {
            self.senders.remove(&id);
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
        watch.changed(1, JobState::Starting);
        assert!(watch.is_empty());
        // A change of a job nobody waits on costs nothing.
        watch.changed(2, JobState::Running);
        assert!(watch.is_empty());
    }

    #[tokio::test]
    async fn a_waiter_wakes_on_a_change_of_state_only() {
        let mut watch = JobWatch::default();
        let mut rx = watch.subscribe(3, JobState::Starting);
        watch.changed(3, JobState::Starting);
        assert!(!rx.has_changed().unwrap());
        watch.changed(3, JobState::Running);
        tokio::time::timeout(std::time::Duration::from_secs(5), rx.changed())
            .await
            .expect("woken")
            .expect("sender alive");
        assert_eq!(*rx.borrow(), JobState::Running);
    }
}
