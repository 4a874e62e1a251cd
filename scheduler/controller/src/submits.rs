//! Group commit of submits. Handlers queue their submits to one writer thread; it takes every
//! submit waiting (up to [`MAX_GROUP`]), checks and stores them under one lock of the cluster
//! in one transaction, so one sync makes the whole group durable, and answers each only after
//! that commit. While a group commits, the next one gathers, so the rate of submits grows with
//! the number of clients instead of being one sync per submit.
//!
//! With a group, the writer runs the scheduling pass itself when none is owed (the spacing
//! after the last pass is over, see `PASS_SPACING`) and the last one was short (see
//! `INLINE_PASS_MAX`), under the same lock, and commits the submits and the starts with one
//! sync before answering: a job submitted to an idle cluster is started by the thread that
//! stored it, with no other thread to wake between the two and one wait for the disk instead
//! of two (under other writers' load, a sync on the development VM's disk took 6 ms at the
//! median and up to 250 ms). Otherwise the group is answered once committed and the
//! scheduler task runs the pass (after the spacing, if one is owed).

use std::sync::mpsc;
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;
use wharf_api::wire::{ErrorKind, SubmitRequest};
use wharf_api::JobId;

use crate::cluster::{Caller, Failure};
use crate::Shared;

/// Most submits committed in one transaction: bounds how long one group holds the cluster.
pub const MAX_GROUP: usize = 256;

/// A submit waiting for the writer.
#[derive(Debug)]
struct Queued {
    caller: Caller,
    req: SubmitRequest,
    answer: oneshot::Sender<Result<JobId, Failure>>,
}

/// Where handlers queue their submits.
#[derive(Debug)]
pub struct Submits(mpsc::Sender<Queued>);

/// The writer's end of the queue, until [`start`] hands it to the writer thread.
#[derive(Debug)]
pub struct Queue(mpsc::Receiver<Queued>);

/// A submit queue and its unstarted writer.
pub fn queue() -> (Submits, Queue) {
    let (tx, rx) = mpsc::channel();
    (Submits(tx), Queue(rx))
}

impl Submits {
    /// Queues a submit and waits for its answer, given once it is committed.
    pub async fn submit(&self, caller: Caller, req: SubmitRequest) -> Result<JobId, Failure> {
        let (answer, answered) = oneshot::channel();
        let gone = || Failure {
            kind: ErrorKind::Internal,
            message: "the controller's submit writer stopped".into(),
        };
        self.0
            .send(Queued {
                caller,
                req,
                answer,
            })
            .map_err(|_| gone())?;
        answered.await.map_err(|_| gone())?
    }
}

/// Starts the writer thread; it ends when `shared` is dropped.
pub fn start(shared: &Arc<Shared>, queue: Queue) -> std::io::Result<()> {
    let shared = Arc::downgrade(shared);
    std::thread::Builder::new()
        .name("wharf-submits".into())
        .spawn(move || write(shared, queue.0))
        .map(drop)
}

fn write(shared: Weak<Shared>, queue: mpsc::Receiver<Queued>) {
    while let Ok(first) = queue.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(more) => group.push(more),
                Err(_) => break,
            }
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        // With no pass owed and the last one short, the group's own pass runs here, under
        // the same lock, and its starts are committed with the submits: one sync makes both
        // durable before any client or node hears of them.
        let mut pass = false;
        let stored_and_started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut cluster = shared.cluster.lock().unwrap_or_else(|p| p.into_inner());
            pass = shared.pass_with_submits(&cluster);
            let refs: Vec<(&Caller, &SubmitRequest)> =
                group.iter().map(|q| (&q.caller, &q.req)).collect();
            let now = crate::now_ms();
            if pass {
                let both = cluster.durable_once(|c| {
                    let answers = c.submit_group(&refs, now);
                    let woken = if answers.iter().any(Result::is_ok) {
                        shared.pass_on(c)
                    } else {
                        Default::default()
                    };
                    (answers, woken)
                });
                match both {
                    Ok(both) => both,
                    Err(e) => {
                        // Stored, perhaps, but not known to be durable: nobody is told they
                        // were (a client's retry with its token finds a job that was).
                        tracing::error!(error = %e.message, "submits not synced to disk");
                        (vec![Err(e); refs.len()], Default::default())
                    }
                }
            } else {
                (cluster.submit_group(&refs, now), Default::default())
            }
        }));
        // The writer outlives a panic (the scheduler's, say): the group hears of it, and the
        // scheduler task tries the pass again.
        let panicked = stored_and_started.is_err();
        let (answers, woken) = stored_and_started.unwrap_or_else(|_| {
            tracing::error!("storing a group of submits panicked");
            let failed = Failure {
                kind: ErrorKind::Internal,
                message: "the controller failed while storing this submit; see its log".into(),
            };
            (vec![Err(failed); group.len()], Default::default())
        });
        let stored = answers.iter().any(Result::is_ok);
        for (q, answer) in group.into_iter().zip(answers) {
            // A client that went away meanwhile has its job stored all the same.
            let _ = q.answer.send(answer);
        }
        woken.iter().for_each(|n| shared.wake_node(n));
        if stored && !pass || panicked {
            shared.wake_scheduler();
        }
    }
}
