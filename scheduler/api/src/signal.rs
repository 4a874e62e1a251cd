//! Signals sent to a running job's processes without ending it (`wharf cancel --signal`,
//! Slurm's `scancel --signal`): the user's request, what the job record keeps of it, and the
//! order that carries it to the job's nodes.
//!
//! A request becomes a [`JobSignal`] in the job's record, numbered in the job's sequence.
//! Each node's agent reports the newest number it has passed on for each job it runs
//! ([`Signalled`]); the controller orders every newer one of the job's current run
//! ([`SignalOrder`]) until the report catches up, so each reaches each node once, even
//! across a lost answer or an agent restart.
//!
//! ```
//! use wharf_api::signal::{Reach, SignalRequest};
//! let req = SignalRequest { signal: 10, batch: false, full: false };
//! // A batch job's script is left out unless asked for, as scancel leaves it out.
//! assert_eq!(req.reach(true), Reach::Steps);
//! assert_eq!(req.reach(false), Reach::Job);
//! ```

use serde::{Deserialize, Serialize};

use crate::JobId;

/// `POST /v1/jobs/{id}/signal` and `POST /v1/jobs/{id}/steps/{step}/signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// The signal's number (Linux's: 10 is SIGUSR1).
    pub signal: i32,
    /// Only the batch script's own process (`-b`): not its children, nor the job's steps.
    #[serde(default)]
    pub batch: bool,
    /// The batch script and its children too (`-f`), besides the job's steps.
    #[serde(default)]
    pub full: bool,
}

impl SignalRequest {
    /// Which of a job's processes the request reaches; `runs_once`: the job runs a batch
    /// script (its command once, on its first node). As scancel's, a plain request leaves a
    /// batch script out: a shell that does not trap the signal would end, and the job with
    /// it, when the signal is meant for the program its steps run.
    pub fn reach(&self, runs_once: bool) -> Reach {
        if self.batch {
            Reach::Batch
        } else if self.full || !runs_once {
            Reach::Job
        } else {
            Reach::Steps
        }
    }
}

/// Which of a job's processes a signal reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// Every process of the job's tasks and of its running steps.
    Job,
    /// Every process of the job's running steps only.
    Steps,
    /// Every process of this one step.
    Step(u32),
    /// Only the batch script's own process (not its children, not the steps).
    Batch,
}

/// A signal sent to a running job, as its record keeps it (the newest 16, whatever the run;
/// only those of the current run are ordered to its nodes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSignal {
    /// Its number in the job's sequence, from 1; never reused, whatever the run.
    pub seq: u64,
    /// The run it was sent to (the job's restart count then): a later run gets none of it.
    pub run: u32,
    /// The signal's number.
    pub signal: i32,
    /// Which processes.
    pub reach: Reach,
    /// Who sent it.
    pub by: String,
}

impl JobSignal {
    /// How many of a job's signals its record keeps (the newest). The controller refuses
    /// another (try again) while this many are not yet passed on by every node of the job,
    /// so none is dropped before its nodes have it.
    pub const KEPT: usize = 16;
}

/// A node's report of a job it runs: the newest of its signals it has passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signalled {
    /// Job id.
    pub job: JobId,
    /// The newest [`JobSignal::seq`] passed on (0: none yet).
    pub seq: u64,
}

/// A signal for a node's agent to pass on to the job's processes there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalOrder {
    /// Job id.
    pub job: JobId,
    /// The signal's [`JobSignal::seq`]: the agent reports it passed on once it has.
    pub seq: u64,
    /// The signal's number.
    pub signal: i32,
    /// Which processes.
    pub reach: Reach,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_script_is_reached_only_when_asked_for() {
        let req = |batch, full| SignalRequest {
            signal: 10,
            batch,
            full,
        };
        assert_eq!(req(false, false).reach(true), Reach::Steps);
        assert_eq!(req(false, true).reach(true), Reach::Job);
        assert_eq!(req(true, false).reach(true), Reach::Batch);
        assert_eq!(req(false, false).reach(false), Reach::Job);
        assert_eq!(req(false, true).reach(false), Reach::Job);
    }

    #[test]
    fn orders_and_requests_read_back() {
        let order = SignalOrder {
            job: 7,
            seq: 3,
            signal: 10,
            reach: Reach::Step(2),
        };
        let text = serde_json::to_string(&order).unwrap();
        assert_eq!(text, r#"{"job":7,"seq":3,"signal":10,"reach":{"step":2}}"#);
        assert_eq!(serde_json::from_str::<SignalOrder>(&text).unwrap(), order);
        let req: SignalRequest = serde_json::from_str(r#"{"signal":12}"#).unwrap();
        assert!(!req.batch && !req.full);
        assert!(serde_json::from_str::<SignalRequest>(r#"{"signal":12,"x":1}"#).is_err());
    }
}
