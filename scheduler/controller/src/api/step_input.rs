//! `POST /v1/agent/steps/input` and `/input/pull`: a step's standard input from its caller's
//! agent to the agents of its tasks that take it, through [`crate::step_input::InputRelay`].
//! Only a node that holds part of the step's job pushes (the caller's agent found its caller
//! inside that job), and a node pulls only for its own tasks of the step.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::Json;
use wharf_api::step::{StepKey, StepRecord};
use wharf_api::step_input::{InputAck, InputBatch, InputPull, InputPush};
use wharf_api::wire::ErrorKind;

use super::{agent_request, fail, with_cluster, AgentNode, ApiResult};
use crate::Shared;

fn relay(s: &Shared) -> std::sync::MutexGuard<'_, crate::step_input::InputRelay> {
    s.step_input.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops `key`'s input (its caller went away).
pub(super) fn forget(s: &Shared, key: StepKey) {
    relay(s).forget(key);
}

/// The ranks of each step that take no more input, as their nodes report.
pub(super) fn closed(s: &Shared, closed: Vec<(StepKey, Vec<u32>)>) {
    if closed.is_empty() {
        return;
    }
    let now = crate::now_ms();
    let mut relay = relay(s);
    for (key, ranks) in closed {
        relay.closed(key, &ranks, now);
    }
}

/// Whether the step still takes input: it runs and is not being stopped.
fn live(step: &StepRecord) -> bool {
    step.exit.is_none() && step.stop.is_none()
}

/// The caller's agent passes on what its caller sent; the answer says where to go on.
pub(super) async fn push(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<InputAck> {
    let push: InputPush = agent_request(&s, &me, bytes)?;
    let (key, node) = (push.key, push.node.clone());
    let step = with_cluster(&s, move |cl, _| cl.step_held_by(key, &node)).await?;
    let ranks = step.input.ranks(step.ntasks());
    let now = crate::now_ms();
    Ok(Json(relay(&s).push(
        key,
        &ranks,
        push.input,
        push.retained_from,
        live(&step),
        now,
    )))
}

/// A node's agent asks for the input of its tasks of the step.
pub(super) async fn pull(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<InputBatch> {
    let pull: InputPull = agent_request(&s, &me, bytes)?;
    let (key, node) = (pull.key, pull.node.clone());
    let (step, idx, _) = with_cluster(&s, move |cl, _| cl.step_seen_from(key, &node)).await?;
    let Some(idx) = idx else {
        return Err(fail(
            ErrorKind::PermissionDenied,
            format!(
                "node {} runs no task of step {}.{}",
                pull.node, key.job, key.step
            ),
        ));
    };
    let ranks = step.input.ranks(step.ntasks());
    let per_node = step.tasks_per_node;
    let base = (idx as u32).saturating_mul(per_node);
    let now = crate::now_ms();
    Ok(Json(relay(&s).pull(
        key,
        &ranks,
        base,
        per_node,
        pull.tasks,
        live(&step),
        now,
    )))
}
