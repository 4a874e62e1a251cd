//! `POST /v1/jobs/{id}/signal` and `POST /v1/jobs/{id}/steps/{step}/signal`: a signal for a
//! running job's (or step's) processes, which go on (`wharf cancel --signal`). The job's
//! nodes are woken to take the order at once.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use wharf_api::signal::SignalRequest;
use wharf_api::step::StepRecord;
use wharf_api::wire::ErrorKind;

use super::{body, caller, fail, job_id, step_id, with_cluster, ApiResult, Peer};
use crate::cluster::Cluster;
use crate::Shared;

/// `POST /v1/jobs/{id}/signal`: an array's job id alone signals every running task of it.
pub(super) async fn job(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let req: SignalRequest = body(&s, bytes)?;
    let (job, nodes) = with_cluster(&s, move |cl, _| {
        let whole = |cl: &mut Cluster| cl.signal_array(&c, id, req);
        cl.on_target(id, task, whole, |cl, job| cl.signal(&c, job, req))
    })
    .await?;
    for node in nodes {
        s.wake_node(&node);
    }
    Ok(Json(job))
}

/// `POST /v1/jobs/{id}/steps/{step}/signal`: only `signal` of the body counts (a step has no
/// batch script).
pub(super) async fn step(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path((id, step)): Path<(String, String)>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<StepRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let step = step_id(&step)?;
    let req: SignalRequest = body(&s, bytes)?;
    if req.batch || req.full {
        return Err(fail(
            ErrorKind::InvalidInput,
            "-b and -f pick a job's batch script, which no step has: name the job alone, or \
             drop them",
        ));
    }
    let (record, nodes) = with_cluster(&s, move |cl, _| {
        let job = cl.resolve_task(id, task)?;
        cl.signal_step(&c, job, step, req.signal)
    })
    .await?;
    for node in nodes {
        s.wake_node(&node);
    }
    Ok(Json(record))
}
