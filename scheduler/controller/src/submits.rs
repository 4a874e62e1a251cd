//! Group commit of submits. Handlers queue their submits to one writer thread; it takes every
//! submit waiting (up to [`MAX_GROUP`]), checks and stores them under one lock of the cluster
//! in one transaction, so one sync makes the whole group durable, and answers each only after
//! that commit. While a group commits, the next one gathers, so the rate of submits grows with
//! the number of clients instead of being one sync per submit.

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
        let answers = {
            let mut cluster = shared.cluster.lock().unwrap_or_else(|p| p.into_inner());
            let refs: Vec<(&Caller, &SubmitRequest)> =
                group.iter().map(|q| (&q.caller, &q.req)).collect();
            cluster.submit_group(&refs, crate::now_ms())
        };
        if answers.iter().any(Result::is_ok) {
            shared.wake_scheduler();
        }
        for (q, answer) in group.into_iter().zip(answers) {
            // A client that went away meanwhile has its job stored all the same.
            let _ = q.answer.send(answer);
        }
    }
}
