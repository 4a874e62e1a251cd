//! The `/v1` HTTP API (routes in `docs/api.md`). Identity comes from the connection: the peer
//! credentials of the Unix socket for users, each node's own key for agents (the join token
//! only joins; see [`crate::node_keys`]). Never from a field: a body naming another node
//! than its key's is refused.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::connect_info::ConnectInfo;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody, QueryRejection};
use axum::extract::DefaultBodyLimit;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use wharf_api::admin::{AdminChange, Associations, AuditEntry, AuditList};
use wharf_api::step::{StepKey, StepRecord, StepStart};
use wharf_api::step_input::{InputPull, InputPush};
use wharf_api::step_output::{OutputAck, OutputBatch, OutputPush, OutputRead};
use wharf_api::wire::{
    ApiError, ErrorKind, JobList, JoinRequest, JoinResponse, NodeList, PollRequest, PollResponse,
    RegisterRequest, RegisterResponse, SubmitRequest, SubmitResponse, WhoAmI,
};
use wharf_api::{JobId, JobState, Owner};

use crate::cluster::steps::StepOutcome;
use crate::cluster::{Caller, Cluster, Failure};
use crate::node_keys::Credential;
use crate::Shared;

mod signal;
mod step_input;

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub enum Peer {
    /// A local process, as SO_PEERCRED tells.
    Local {
        /// User id.
        uid: u32,
        /// Group id.
        gid: u32,
    },
    /// A TCP client: no user identity.
    Remote(std::net::SocketAddr),
    /// Peer credentials could not be read.
    Unknown,
}

/// An error response.
#[derive(Debug)]
pub struct ApiFailure(StatusCode, ApiError);

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

impl From<Failure> for ApiFailure {
    fn from(f: Failure) -> Self {
        let status = match f.kind {
            ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiFailure(
            status,
            ApiError {
                error: f.message,
                kind: f.kind,
            },
        )
    }
}

fn fail(kind: ErrorKind, message: impl Into<String>) -> ApiFailure {
    Failure {
        kind,
        message: message.into(),
    }
    .into()
}

type ApiResult<T> = Result<Json<T>, ApiFailure>;

/// The router for both listeners.
///
/// Users' routes take bodies up to `[limits] max_request_size`. The agents' routes have their
/// own, larger limit (`max_agent_request_size`): a poll reports every job the node holds, and
/// a node with many ended jobs must never be shut out by the size of its own report. The join
/// token is checked before an agent's body is read, so that only agents may send that much.
pub fn router(shared: Arc<Shared>) -> Router {
    let agents = Router::new()
        .route(JOIN, post(join))
        .route("/v1/agent/register", post(register))
        .route("/v1/agent/poll", post(poll))
        .route("/v1/agent/steps", post(step_start))
        .route("/v1/agent/steps/status", post(step_status))
        .route("/v1/agent/steps/cancel", post(step_cancel))
        .route("/v1/agent/steps/output", post(step_output_push))
        .route("/v1/agent/steps/output/read", post(step_output_read))
        .route("/v1/agent/steps/input", post(step_input::push))
        .route("/v1/agent/steps/input/pull", post(step_input::pull))
        .layer(DefaultBodyLimit::max(shared.config.max_agent_request_bytes))
        .route_layer(middleware::from_fn_with_state(shared.clone(), agents_only));
    Router::new()
        .route("/v1/whoami", get(whoami))
        .route("/v1/jobs", post(submit).get(list))
        .route("/v1/jobs/{id}", get(show))
        .route("/v1/jobs/{id}/wait", get(wait))
        .route("/v1/jobs/{id}/cancel", post(cancel))
        .route("/v1/jobs/{id}/steps/{step}/cancel", post(cancel_step))
        .route("/v1/jobs/{id}/signal", post(signal::job))
        .route("/v1/jobs/{id}/steps/{step}/signal", post(signal::step))
        .route("/v1/jobs/{id}/hold", post(hold))
        .route("/v1/jobs/{id}/release", post(release))
        .route("/v1/jobs/{id}/requeue", post(requeue))
        .route("/v1/jobs/{id}/update", post(update))
        .route("/v1/acct", get(acct))
        .route("/v1/report", get(report))
        .route("/v1/share", get(share))
        .route("/v1/nodes", get(nodes))
        .route("/v1/partitions", get(partitions))
        .route("/v1/nodes/{name}/state", post(node_state))
        .route("/v1/nodes/{name}/forget-key", post(forget_key))
        .route("/v1/nodes/keys", get(node_keys))
        .route("/v1/images/pull", post(prepull))
        .route("/v1/images/pull/{id}", get(prepull_status))
        .route("/v1/admin/change", post(admin_change))
        .route("/v1/admin/associations", get(associations))
        .route("/v1/admin/audit", get(audit))
        .route("/v1/admin/ledger", get(ledger_status))
        .layer(DefaultBodyLimit::max(shared.config.max_request_bytes))
        .merge(agents)
        .fallback(|| async { fail(ErrorKind::NotFound, "no such API route; see docs/api.md") })
        .with_state(shared)
}

/// The route the join token is good for.
const JOIN: &str = "/v1/agent/join";

/// The node whose key an agent's request carries, as [`agents_only`] found it.
#[derive(Debug, Clone)]
struct AgentNode(String);

/// Lets only requests with a node's key reach the agents' routes (the key's node passed on
/// to the handler as an [`AgentNode`]), and the join token the join route, before their
/// bodies are read: each request's credential is checked once.
async fn agents_only(
    State(s): State<Arc<Shared>>,
    mut req: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let checked = if req.uri().path() == JOIN {
        joining(&s, req.headers())
    } else {
        agent_node(&s, req.headers()).map(|node| {
            req.extensions_mut().insert(AgentNode(node));
        })
    };
    match checked {
        Ok(()) => next.run(req).await,
        Err(refused) => refused.into_response(),
    }
}

fn caller(shared: &Shared, peer: &Peer) -> Result<Caller, ApiFailure> {
    match peer {
        Peer::Local { uid, gid } => {
            let user = shared.user_names.of(*uid);
            Ok(Caller {
                owner: Owner {
                    uid: *uid,
                    gid: *gid,
                    user,
                },
                admin: *uid == 0 || shared.config.admins.contains(uid),
            })
        }
        Peer::Remote(addr) => Err(fail(
            ErrorKind::PermissionDenied,
            format!(
                "user requests must come over the controller's Unix socket (not TCP from {addr})"
            ),
        )),
        Peer::Unknown => Err(fail(
            ErrorKind::PermissionDenied,
            "cannot read the caller's credentials",
        )),
    }
}

/// A user's body, as JSON, within the users' limit.
fn body<T: serde::de::DeserializeOwned>(
    s: &Shared,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiFailure> {
    json_body(bytes, StatusCode::BAD_REQUEST, || {
        format!(
            "request body is over the controller's limit of {} bytes ([limits] \
             max_request_size); make the job smaller (a long script or environment \
             belongs in a file)",
            s.config.max_request_bytes
        )
    })
}

/// An agent's body: like [`body`], with the agents' own limit, and 413 past it: an agent
/// that can split what it sends (a step output push) tells "too large" from "wrong" by the
/// status and sends less.
fn agent_body<T: serde::de::DeserializeOwned>(
    s: &Shared,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiFailure> {
    json_body(bytes, StatusCode::PAYLOAD_TOO_LARGE, || {
        format!(
            "agent report is over the controller's limit of {} bytes ([limits] \
             max_agent_request_size); raise it for nodes that hold this many jobs",
            s.config.max_agent_request_bytes
        )
    })
}

/// A body read within its route's limit and parsed as JSON; a body past the limit is
/// answered `too_large` (invalid input), with `over_limit`'s words on which limit it broke
/// and what to do.
fn json_body<T: serde::de::DeserializeOwned>(
    bytes: Result<Bytes, BytesRejection>,
    too_large: StatusCode,
    over_limit: impl FnOnce() -> String,
) -> Result<T, ApiFailure> {
    let bytes = bytes.map_err(|e| match e {
        BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => ApiFailure(
            too_large,
            ApiError {
                error: over_limit(),
                kind: ErrorKind::InvalidInput,
            },
        ),
        other => fail(ErrorKind::InvalidInput, format!("request body: {other}")),
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("request body: {e}")))
}

/// Runs a closure on the cluster state off the async threads (it commits to disk).
async fn with_cluster<T: Send + 'static>(
    shared: &Arc<Shared>,
    f: impl FnOnce(&mut Cluster, u64) -> Result<T, Failure> + Send + 'static,
) -> Result<T, ApiFailure> {
    let shared = shared.clone();
    tokio::task::spawn_blocking(move || {
        let mut cluster = shared.cluster.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut cluster, crate::now_ms())
    })
    .await
    .map_err(|e| fail(ErrorKind::Internal, format!("worker failed: {e}")))?
    .map_err(ApiFailure::from)
}

async fn whoami(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
) -> ApiResult<WhoAmI> {
    let c = caller(&s, &peer)?;
    Ok(Json(WhoAmI {
        owner: c.owner,
        admin: c.admin,
    }))
}

async fn submit(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<SubmitResponse>), ApiFailure> {
    let c = caller(&s, &peer)?;
    let req: SubmitRequest = body(&s, bytes)?;
    // Committed with the submits that arrive with it; the writer wakes the scheduler.
    let id = s.submits.submit(c, req).await?;
    Ok((StatusCode::CREATED, Json(SubmitResponse { id })))
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    /// Also return up to this many ended jobs.
    #[serde(default)]
    finished: u32,
    /// Only this user's jobs.
    user: Option<u32>,
    /// Leave each job's spec out (what a queue listing shows does not need it).
    #[serde(default)]
    brief: bool,
    /// Answer `{"rows": [JobRow]}`, only what a queue listing shows (`wharf_api::listing`).
    #[serde(default)]
    rows: bool,
    /// Only ended jobs in these states (comma-separated, as `wharf queue -t` takes them).
    states: Option<String>,
    /// Only ended jobs of these users (comma-separated names).
    users: Option<String>,
    /// Only these ended jobs (comma-separated: `ID`, an array's `ID`, or `ID_TASK`).
    jobs: Option<String>,
    /// Only jobs, active or ended, in these partitions (comma-separated names).
    partitions: Option<String>,
}

/// Most jobs one listing may name (`wharf queue -j`).
const MAX_NAMED_JOBS: usize = 1000;
/// Most partitions one listing may name (`wharf queue -p`).
const MAX_NAMED_PARTITIONS: usize = 100;
/// Most users one listing may name (`wharf queue -u`): each is looked up on this host.
const MAX_NAMED_USERS: usize = 100;

impl ListQuery {
    /// The jobs it asks for ([`crate::store::ListFilter`]), or what it got wrong.
    fn filter(&self) -> Result<crate::store::ListFilter, ApiFailure> {
        let bad = |m: String| fail(ErrorKind::InvalidInput, m);
        let words = |text: &Option<String>| -> Vec<String> {
            (text.iter())
                .flat_map(|t| t.split(','))
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(str::to_string)
                .collect()
        };
        let mut filter = crate::store::ListFilter::default();
        let mut users = words(&self.users);
        users.sort();
        users.dedup();
        if users.len() > MAX_NAMED_USERS {
            return Err(bad(format!(
                "{} users named; at most {MAX_NAMED_USERS} may be",
                users.len()
            )));
        }
        // By uid where this host names one (the store's index), else by name.
        for name in users {
            match nix::unistd::User::from_name(&name) {
                Ok(Some(u)) => filter.uids.push(u.uid.as_raw()),
                _ => filter.users.push(name),
            }
        }
        filter.partitions = words(&self.partitions);
        filter.partitions.sort();
        filter.partitions.dedup();
        if filter.partitions.len() > MAX_NAMED_PARTITIONS {
            return Err(bad(format!(
                "{} partitions named; at most {MAX_NAMED_PARTITIONS} may be",
                filter.partitions.len()
            )));
        }
        for s in words(&self.states) {
            let state = wharf_api::JobState::parse(&s)
                .ok_or_else(|| bad(format!("unknown job state {s:?}")))?;
            filter.states.push(state);
        }
        let jobs = words(&self.jobs);
        if jobs.len() > MAX_NAMED_JOBS {
            return Err(bad(format!(
                "{} jobs named; at most {MAX_NAMED_JOBS} may be",
                jobs.len()
            )));
        }
        for j in jobs {
            let job = wharf_api::job::parse_job_ref(&j)
                .ok_or_else(|| bad(format!("{j:?} is not a job id")))?;
            filter.jobs.push(job);
        }
        Ok(filter)
    }
}

async fn list(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Query(q): Query<ListQuery>,
) -> Result<Response, ApiFailure> {
    let c = caller(&s, &peer)?;
    let finished = q.finished.min(10_000);
    let filter = q.filter()?;
    if q.rows {
        let body =
            with_cluster(&s, move |cl, _| cl.list_rows(&c, finished, q.user, &filter)).await?;
        let json = [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )];
        return Ok((json, body).into_response());
    }
    let jobs = with_cluster(&s, move |cl, _| {
        cl.list_where(&c, finished, q.user, q.brief, &filter)
    })
    .await?;
    Ok(Json(JobList { jobs }).into_response())
}

async fn acct(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Query(q): Query<wharf_api::wire::AcctQuery>,
) -> ApiResult<JobList> {
    let c = caller(&s, &peer)?;
    let jobs = with_cluster(&s, move |cl, now| cl.acct(&c, &q, now)).await?;
    Ok(Json(JobList { jobs }))
}

/// `GET /v1/report?since=MS&until=MS`.
#[derive(Debug, Deserialize)]
struct ReportQuery {
    since: u64,
    until: Option<u64>,
}

async fn report(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Query(q): Query<ReportQuery>,
) -> ApiResult<wharf_api::report::Report> {
    let c = caller(&s, &peer)?;
    let r = with_cluster(&s, move |cl, now| {
        cl.report(&c, q.since, q.until.unwrap_or(now), now)
    })
    .await?;
    Ok(Json(r))
}

/// A step's id: its number within its job.
fn step_id(text: &str) -> Result<u32, ApiFailure> {
    text.parse().map_err(|_| {
        fail(
            ErrorKind::InvalidInput,
            format!("{text:?} is not a step id (a step's number: 0, 1, ...)"),
        )
    })
}

/// A job id, or `ARRAYID_TASKID` for one task of an array.
fn job_id(text: &str) -> Result<(JobId, Option<u32>), ApiFailure> {
    let bad = || {
        fail(
            ErrorKind::InvalidInput,
            format!("{text:?} is not a job id (ID, or ARRAYID_TASKID for an array task)"),
        )
    };
    wharf_api::job::parse_job_ref(text).ok_or_else(bad)
}

async fn show(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    Ok(Json(
        with_cluster(&s, move |cl, _| cl.job(&c, cl.resolve_task(id, task)?)).await?,
    ))
}

#[derive(Debug, Deserialize)]
struct WaitQuery {
    /// The states the caller waits out, comma-separated (`PENDING,STARTING`).
    state: String,
    /// The longest wait, ms (at most `controller.poll_wait`, which is also the default).
    wait_ms: Option<u64>,
}

/// The states of `state=A,B`; a clear error for an empty list or an unknown name.
fn wait_states(text: &str) -> Result<Vec<JobState>, ApiFailure> {
    text.split(',')
        .map(|name| {
            JobState::parse(name).ok_or_else(|| {
                let known: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
                fail(
                    ErrorKind::InvalidInput,
                    format!(
                        "state={name:?} is not a job state; give one or more of {}, comma-separated",
                        known.join(", ")
                    ),
                )
            })
        })
        .collect()
}

/// A long poll: answers with the job the moment a committed change takes it out of the
/// states the caller waits out (at once if it is in another already), or as it is after the
/// wait. Each waiter holds a connection, charged to its user like any other (`[limits]
/// max_connections_per_user`); the wait is capped at `controller.poll_wait`, which the
/// configuration keeps below the idle timeout.
async fn wait(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
    query: Result<Query<WaitQuery>, QueryRejection>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let Query(q) = query.map_err(|e| {
        fail(
            ErrorKind::InvalidInput,
            format!(
                "{e} (wait takes state=STATE[,STATE...], the states to wait out, and wait_ms=N)"
            ),
        )
    })?;
    let states = wait_states(&q.state)?;
    let cap = s.config.poll_wait.as_millis() as u64;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(q.wait_ms.unwrap_or(cap).min(cap));
    let c2 = c.clone();
    let (job, rx) = with_cluster(&s, move |cl, _| {
        let id = cl.resolve_task(id, task)?;
        cl.watch_job(&c2, id)
    })
    .await?;
    let Some(mut rx) = rx.filter(|_| states.contains(&job.state)) else {
        return Ok(Json(job));
    };
    // Woken by the commit that changes the job's state; an ended job's sender goes away.
    let _ =
        tokio::time::timeout_at(deadline, rx.wait_for(|now| !states.contains(&now.state))).await;
    // The record committed with the change: no second trip to the cluster's lock (nor to the
    // store, for an ended job, which the cluster no longer keeps).
    let committed = rx.borrow().record.clone();
    if let Some(job) = committed.filter(|j| !states.contains(&j.state)) {
        return Ok(Json(crate::visibility::view(&c, (*job).clone())));
    }
    let id = job.id;
    Ok(Json(with_cluster(&s, move |cl, _| cl.job(&c, id)).await?))
}

async fn cancel(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let (job, nodes) = with_cluster(&s, move |cl, now| {
        let whole = |cl: &mut Cluster| cl.cancel_array(&c, id, now);
        cl.on_target(id, task, whole, |cl, job| cl.cancel(&c, job, now))
    })
    .await?;
    for node in nodes {
        s.wake_node(&node);
    }
    s.wake_scheduler();
    Ok(Json(job))
}

/// `POST /v1/jobs/{id}/steps/{step}/cancel`: stops one step of a running job (`wharf cancel
/// ID.STEP`); the job goes on.
async fn cancel_step(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path((id, step)): Path<(String, String)>,
) -> ApiResult<StepRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let step = step_id(&step)?;
    let (record, nodes) = with_cluster(&s, move |cl, _| {
        let job = cl.resolve_task(id, task)?;
        cl.cancel_user_step(&c, job, step)
    })
    .await?;
    for node in nodes {
        s.wake_node(&node);
    }
    Ok(Json(record))
}

async fn requeue(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let (job, nodes) = with_cluster(&s, move |cl, _| {
        let whole = |cl: &mut Cluster| cl.requeue_array(&c, id);
        cl.on_target(id, task, whole, |cl, job| cl.requeue(&c, job))
    })
    .await?;
    for node in nodes {
        s.wake_node(&node);
    }
    Ok(Json(job))
}

async fn hold(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    Ok(Json(
        with_cluster(&s, move |cl, _| {
            let whole = |cl: &mut Cluster| cl.hold_array(&c, id);
            cl.on_target(id, task, whole, |cl, job| cl.hold(&c, job))
        })
        .await?,
    ))
}

async fn release(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let job = with_cluster(&s, move |cl, _| {
        let whole = |cl: &mut Cluster| cl.release_array(&c, id);
        cl.on_target(id, task, whole, |cl, job| cl.release(&c, job))
    })
    .await?;
    s.wake_scheduler();
    Ok(Json(job))
}

async fn update(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<wharf_api::JobRecord> {
    let c = caller(&s, &peer)?;
    let (id, task) = job_id(&id)?;
    let req: wharf_api::wire::UpdateRequest = body(&s, bytes)?;
    let (job, tasks_nodes) = with_cluster(&s, move |cl, now| {
        let whole = |cl: &mut Cluster| cl.update_array(&c, id, &req, now);
        let job = cl.on_target(id, task, whole, |cl, job| cl.update(&c, job, &req, now))?;
        // An array's running tasks were changed too (a time limit).
        let nodes = if task.is_none() {
            cl.array_nodes(id)
        } else {
            Vec::new()
        };
        Ok((job, nodes))
    })
    .await?;
    s.wake_scheduler();
    // A running job's nodes hear of a new time limit at once.
    for n in job.nodes().chain(tasks_nodes.iter().map(String::as_str)) {
        s.wake_node(n);
    }
    Ok(Json(job))
}

async fn nodes(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
) -> ApiResult<NodeList> {
    caller(&s, &peer)?;
    Ok(Json(NodeList {
        nodes: with_cluster(&s, |cl, _| Ok(cl.nodes())).await?,
    }))
}

/// `GET /v1/share?all=BOOL`.
#[derive(Debug, Deserialize)]
struct ShareQuery {
    /// Every user's line (admins only).
    #[serde(default)]
    all: bool,
}

/// `wharf share`: the fair-share tree (Slurm's `sshare`), as far as the caller may see it.
async fn share(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Query(q): Query<ShareQuery>,
) -> ApiResult<wharf_api::share::ShareTree> {
    let c = caller(&s, &peer)?;
    let tree = with_cluster(&s, move |cl, now| cl.fair_share(&c, q.all, now)).await?;
    Ok(Json(tree))
}

/// `wharf nodes --partitions`: each partition's nodes and jobs (anyone).
async fn partitions(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
) -> ApiResult<wharf_api::wire::PartitionList> {
    caller(&s, &peer)?;
    Ok(Json(with_cluster(&s, |cl, _| Ok(cl.partitions())).await?))
}

/// `wharf nodes --drain/--resume` (admins).
async fn node_state(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(name): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<wharf_api::NodeRecord> {
    let c = caller(&s, &peer)?;
    let req: wharf_api::wire::NodeStateRequest = body(&s, bytes)?;
    let node = with_cluster(&s, move |cl, now| cl.set_node_state(&c, &name, &req, now)).await?;
    // A resumed node may take pending jobs now.
    s.wake_scheduler();
    Ok(Json(node))
}

/// `wharf image pull REF --nodes ...`: an admin's pre-pull; each node is woken to take it.
async fn prepull(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<wharf_api::prepull::PrePull> {
    let c = caller(&s, &peer)?;
    let req: wharf_api::prepull::PrePullRequest = body(&s, bytes)?;
    let pull = with_cluster(&s, move |cl, _| cl.start_prepull(&c, &req)).await?;
    for n in &pull.nodes {
        s.wake_node(&n.node);
    }
    Ok(Json(pull))
}

/// A pre-pull as it stands.
async fn prepull_status(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(id): Path<String>,
) -> ApiResult<wharf_api::prepull::PrePull> {
    let c = caller(&s, &peer)?;
    let id: u64 = id.parse().map_err(|_| {
        fail(
            ErrorKind::InvalidInput,
            format!("bad pre-pull id {id:?}: a number"),
        )
    })?;
    Ok(Json(
        with_cluster(&s, move |cl, _| cl.prepull(&c, id)).await?,
    ))
}

/// `wharf admin ... add|modify|rm`: one association change, audited.
async fn admin_change(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<AuditEntry> {
    let c = caller(&s, &peer)?;
    let req: AdminChange = body(&s, bytes)?;
    let entry = with_cluster(&s, move |cl, now| cl.admin_change(&c, &req, now)).await?;
    // The next pass works with the new associations.
    s.wake_scheduler();
    Ok(Json(entry))
}

async fn associations(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
) -> ApiResult<Associations> {
    caller(&s, &peer)?;
    Ok(Json(with_cluster(&s, |cl, _| Ok(cl.associations())).await?))
}

async fn ledger_status(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
) -> ApiResult<wharf_api::admin::LedgerStatus> {
    caller(&s, &peer)?;
    Ok(Json(with_cluster(&s, |cl, _| cl.ledger_status()).await?))
}

#[derive(Debug, Deserialize)]
struct AuditQuery {
    /// Only changes at or after this time, ms since the epoch.
    #[serde(default)]
    since: u64,
    /// At most this many (the newest).
    #[serde(default = "audit_limit")]
    limit: u32,
}

fn audit_limit() -> u32 {
    1000
}

async fn audit(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Query(q): Query<AuditQuery>,
) -> ApiResult<AuditList> {
    let c = caller(&s, &peer)?;
    let limit = q.limit.min(100_000);
    let entries = with_cluster(&s, move |cl, _| cl.audit(&c, q.since, limit)).await?;
    Ok(Json(AuditList { entries }))
}

/// The node whose key the request carries.
fn agent_node(s: &Shared, headers: &HeaderMap) -> Result<String, ApiFailure> {
    match s.node_keys.check(headers) {
        Some(Credential::Node(node)) => Ok(node),
        Some(Credential::Join) => Err(fail(
            ErrorKind::PermissionDenied,
            "the join token only joins a node (POST /v1/agent/join); an agent then sends its \
             node's own key",
        )),
        // 401, which an agent takes as its cue to join again (any other refusal is not).
        None => Err(ApiFailure(
            StatusCode::UNAUTHORIZED,
            ApiError {
                error: "agent requests need their node's key (a joining agent, the cluster's \
                        join token); this one has neither, or a key the controller does not \
                        know (forgotten by an admin, or a new database)"
                    .into(),
                kind: ErrorKind::PermissionDenied,
            },
        )),
    }
}

/// The request carries the join token.
fn joining(s: &Shared, headers: &HeaderMap) -> Result<(), ApiFailure> {
    match s.node_keys.check(headers) {
        Some(Credential::Join) => Ok(()),
        _ => Err(fail(
            ErrorKind::PermissionDenied,
            "joining needs the cluster's join token",
        )),
    }
}

/// An agent's body that names the node it speaks for.
trait FromNode {
    fn node(&self) -> &str;
}

macro_rules! from_node {
    ($($t:ty => |$r:ident| $e:expr),* $(,)?) => {
        $(impl FromNode for $t {
            fn node(&self) -> &str {
                let $r = self;
                $e
            }
        })*
    };
}

from_node! {
    RegisterRequest => |r| &r.node.name,
    PollRequest => |r| &r.node,
    StepStart => |r| &r.node,
    OutputPush => |r| &r.node,
    OutputRead => |r| &r.node,
    InputPush => |r| &r.node,
    InputPull => |r| &r.node,
}

/// An agent's request body, which must speak for `me`, the node of its key.
fn agent_request<T: serde::de::DeserializeOwned + FromNode>(
    s: &Shared,
    me: &str,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<T, ApiFailure> {
    let req: T = agent_body(s, bytes)?;
    if req.node() != me {
        tracing::warn!(key = %me, claimed = ?req.node(), "an agent spoke for another node; refused");
        return Err(fail(
            ErrorKind::PermissionDenied,
            format!(
                "this request speaks for node {:?}, but its key is node {me:?}'s",
                req.node()
            ),
        ));
    }
    Ok(req)
}

/// `POST /v1/agent/join`: a node that holds no key yet takes the one its agent made (see
/// [`crate::node_keys`]); the same key again is a join whose answer was lost.
async fn join(
    State(s): State<Arc<Shared>>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<JoinResponse> {
    let req: JoinRequest = agent_body(&s, bytes)?;
    if !wharf_api::wire::is_node_key(&req.key) {
        return Err(fail(
            ErrorKind::InvalidInput,
            format!(
                "node {:?}: a key is wnk_ and 64 lower-case hex digits (32 random bytes)",
                req.node
            ),
        ));
    }
    let hash = crate::node_keys::hash(&req.key);
    let (node, keys) = (req.node.clone(), s.node_keys.clone());
    // Taken whether or not this request is still waited for.
    let added = with_cluster(&s, move |cl, now| cl.add_node_key(&keys, &node, &hash, now)).await?;
    match added {
        crate::store::KeyAdded::Other => Err(fail(
            ErrorKind::Conflict,
            format!(
                "node {:?} has joined already and holds another key; if its agent lost it (a \
                 reinstalled node), an admin lets it join again with `wharf nodes \
                 --forget-key {}`",
                req.node, req.node
            ),
        )),
        crate::store::KeyAdded::New => {
            tracing::info!(node = %req.node, "node joined with a key of its own");
            Ok(Json(JoinResponse { node: req.node }))
        }
        crate::store::KeyAdded::Same => Ok(Json(JoinResponse { node: req.node })),
    }
}

/// `GET /v1/nodes/keys` (admins): the nodes that hold a key.
async fn node_keys(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
) -> ApiResult<wharf_api::wire::NodeKeyList> {
    let c = caller(&s, &peer)?;
    Ok(Json(
        with_cluster(&s, move |cl, _| cl.node_key_list(&c)).await?,
    ))
}

/// `POST /v1/nodes/{name}/forget-key` (admins): the node's key is worth nothing from now on.
async fn forget_key(
    State(s): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(name): Path<String>,
) -> ApiResult<wharf_api::wire::KeyForgotten> {
    let c = caller(&s, &peer)?;
    let keys = s.node_keys.clone();
    let node = name.clone();
    with_cluster(&s, move |cl, _| cl.forget_node_key(&keys, &c, &node)).await?;
    Ok(Json(wharf_api::wire::KeyForgotten { node: name }))
}

async fn register(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<RegisterResponse> {
    let req: RegisterRequest = agent_request(&s, &me, bytes)?;
    with_cluster(&s, move |cl, now| cl.register(req.node, now)).await?;
    s.wake_scheduler();
    Ok(Json(RegisterResponse {
        poll_wait_ms: s.config.poll_wait.as_millis() as u64,
    }))
}

/// The keys of the `items` that `keep` selects.
fn keys<T, K: Ord>(items: &[T], keep: impl Fn(&T) -> bool, key: impl Fn(&T) -> K) -> BTreeSet<K> {
    items.iter().filter(|i| keep(i)).map(key).collect()
}

async fn poll(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<PollResponse> {
    let req: PollRequest = agent_request(&s, &me, bytes)?;
    let node = req.node.clone();
    let held = keys(&req.jobs, |j| j.exit.is_none(), |j| j.id);
    let stopping = keys(&req.jobs, |j| j.exit.is_none() && j.stopping, |j| j.id);
    // Gang ranks the node has prepared: released once every node of their gang is ready.
    let prepared = keys(&req.jobs, |j| j.exit.is_none() && j.ready, |j| j.id);
    // The time limits the node holds its running jobs to, to set those changed since.
    let limits: Vec<(JobId, u64)> = (req.jobs.iter())
        .filter(|j| j.exit.is_none())
        .filter_map(|j| Some((j.id, j.time_limit?)))
        .collect();
    let signalled = req.signalled.clone();
    // Jobs whose image the node is pulling: their launch order is under way there, so it is
    // not repeated (an answer at once to each poll would make the agent poll without pause
    // for as long as the pull lasts); the agent's progress reports wake it instead.
    let pulling: BTreeSet<JobId> = req.pulling.iter().map(|p| p.job).collect();
    // Likewise the pre-pulls this node reports: their orders are repeated (an agent drops
    // a finished part once its order is gone) but do not answer a poll at once.
    let prepulls: Vec<u64> = req.prepulls.iter().map(|p| p.id).collect();
    let wait = Duration::from_millis(req.wait_ms.min(s.config.poll_wait.as_millis() as u64));
    let notify = s.node_notify(&node);
    // Register interest before reading state so a wake-up between the two is not lost.
    let mut notified = Box::pin(notify.clone().notified_owned());
    notified.as_mut().enable();
    let steps_held = keys(&req.steps, |st| st.exit.is_none(), |st| st.key);
    // Ended tasks give back GPUs that steps of theirs held (a job's end too).
    let steps_ended =
        req.steps.iter().any(|st| st.exit.is_some()) || req.jobs.iter().any(|j| j.exit.is_some());
    let steps_stopping = keys(
        &req.steps,
        |st| st.exit.is_none() && st.stopping,
        |st| st.key,
    );
    let (ingested, (forget_steps, step_wake), input_closed) = with_cluster(&s, move |cl, now| {
        let ingested = cl.ingest(&req, now)?;
        if ingested.stale {
            return Ok((ingested, Default::default(), vec![]));
        }
        cl.signals_reported(&req.node, &req.signalled);
        let steps = cl.ingest_steps(&req.node, &req.steps, now)?;
        let closed = cl.input_closed_ranks(&req.node, &req.steps);
        Ok((ingested, steps, closed))
    })
    .await?;
    step_input::closed(&s, input_closed);
    if steps_ended {
        s.steps_ended.notify_waiters();
    }
    if ingested.stale {
        // Its agent no longer waits for this answer.
        return Ok(Json(PollResponse::default()));
    }
    let crate::cluster::Ingested {
        forget, mut wake, ..
    } = ingested;
    wake.extend(step_wake);
    if !forget.is_empty() {
        s.wake_scheduler();
    }
    // A rank here ended its gang's run: the other ranks' nodes hear of it now.
    for n in &wake {
        s.wake_node(n);
    }
    let deadline = tokio::time::Instant::now() + wait;
    // A changed time limit answers at once only once something woke this poll (its update
    // does): a node that still reports the old one when it asks again gets it with the next
    // answer that goes out anyway, so an agent that cannot apply it asks no faster. A signal
    // answers at once, even a request that came between two polls: the agent records each
    // as passed on whether or not it reached a process, so only a lost answer repeats it.
    let mut woken = false;
    loop {
        let (n, h, st, pr) = (
            node.clone(),
            held.clone(),
            stopping.clone(),
            prepared.clone(),
        );
        let (sh, ss) = (steps_held.clone(), steps_stopping.clone());
        let (lim, sig) = (limits.clone(), signalled.clone());
        let ((mut launch, kill), pull, (steps, kill_steps), (limits_now, signals)) =
            with_cluster(&s, move |cl, _| {
                Ok((
                    cl.orders(&n, &h, &st, &pr),
                    cl.pull_orders(&n),
                    cl.step_orders(&n, &sh, &ss),
                    (cl.limit_orders(&n, &lim), cl.signal_orders(&n, &sig)),
                ))
            })
            .await?;
        launch.retain(|order| !pulling.contains(&order.id));
        let new_pull = pull.iter().any(|o| !prepulls.contains(&o.id));
        if !launch.is_empty()
            || !kill.is_empty()
            || !forget.is_empty()
            || new_pull
            || !steps.is_empty()
            || !kill_steps.is_empty()
            || !forget_steps.is_empty()
            || (woken && !limits_now.is_empty())
            || !signals.is_empty()
            || tokio::time::Instant::now() >= deadline
        {
            return Ok(Json(PollResponse {
                launch,
                kill,
                forget,
                pull,
                steps,
                kill_steps,
                forget_steps: forget_steps.clone(),
                limits: limits_now,
                signals,
            }));
        }
        // Woken or timed out: look again (past the deadline the answer goes out as it is).
        if tokio::time::timeout_at(deadline, notified.as_mut())
            .await
            .is_err()
        {
            continue;
        }
        woken = true;
        notified = Box::pin(notify.clone().notified_owned());
        notified.as_mut().enable();
    }
}

/// Longest a step start is held waiting for GPUs the job's other steps hold, whatever its
/// agent asks: the agent asks again, and sees meanwhile whether its caller went away.
const MAX_STEP_WAIT_MS: u64 = 30_000;

/// `POST /v1/agent/steps`: a step asked for from inside a job, forwarded by the agent of the
/// caller's node with the job and uid it found from the kernel. The step's nodes hear of it
/// at once. One whose GPUs are held by the job's other steps is held up to its `wait_ms`,
/// looked at again as steps end, and answered `Unavailable` (with which steps hold them)
/// when it still waits.
async fn step_start(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<StepRecord> {
    let req: StepStart = agent_request(&s, &me, bytes)?;
    let job = req.job;
    let until =
        tokio::time::Instant::now() + Duration::from_millis(req.wait_ms.min(MAX_STEP_WAIT_MS));
    let step = loop {
        // Interest first, so that an end between the look and the wait is not lost.
        let ended = s.steps_ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        let asked = req.clone();
        match with_cluster(&s, move |cl, now| cl.start_step(asked, now)).await? {
            StepOutcome::Started(step) => break *step,
            StepOutcome::Waits(busy) => {
                // Looked at again each second too: a step ended by the controller itself (a
                // stop before it started, its job's end) wakes no one.
                let now = tokio::time::Instant::now();
                if now >= until {
                    return Err(Failure {
                        kind: ErrorKind::Unavailable,
                        message: busy.to_string(),
                    }
                    .into());
                }
                let next = until.min(now + Duration::from_secs(1));
                let _ = tokio::time::timeout_at(next, ended).await;
            }
        }
    };
    // A requeued job numbers its steps from 0 again: nothing the relays hold under this key
    // (an earlier run's buffers, its closed ranks) is the new step's.
    let key = StepKey { job, step: step.id };
    relay(&s).forget(key);
    step_input::forget(&s, key);
    for n in &step.nodes {
        s.wake_node(&n.node);
    }
    Ok(Json(step))
}

/// `POST /v1/agent/steps/status`: a step as it stands.
async fn step_status(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<StepRecord> {
    let key: StepKey = agent_body(&s, bytes)?;
    Ok(Json(
        with_cluster(&s, move |cl, _| cl.step_held_by(key, &me)).await?,
    ))
}

/// `POST /v1/agent/steps/cancel`: the caller of a step went away; its tasks are stopped.
async fn step_cancel(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<StepRecord> {
    let key: StepKey = agent_body(&s, bytes)?;
    let (nodes, step) = with_cluster(&s, move |cl, _| {
        cl.step_held_by(key, &me)?;
        let nodes = cl.cancel_step(key, "its caller (wharf step) went away")?;
        Ok((nodes, cl.step(key)?))
    })
    .await?;
    for n in &nodes {
        s.wake_node(n);
    }
    relay(&s).abandon(key, crate::now_ms());
    step_input::forget(&s, key);
    Ok(Json(step))
}

fn relay(s: &Shared) -> std::sync::MutexGuard<'_, crate::step_output::Relay> {
    s.step_output.lock().unwrap_or_else(|p| p.into_inner())
}

/// `POST /v1/agent/steps/output`: a node's agent passes on what its tasks of a step wrote;
/// the answer says, per stream, where to go on (or to push no more).
async fn step_output_push(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<OutputAck> {
    let push: OutputPush = agent_request(&s, &me, bytes)?;
    let (key, node) = (push.key, push.node.clone());
    // A node that holds none of the step's tasks is refused before the buffer is looked at:
    // it may not turn on the step's discarding (which stops the step's tasks) nor add to it.
    let found = with_cluster(&s, move |cl, _| Ok(cl.step_output_from(key, &node))).await?;
    let (step, idx) = match found {
        Ok(Some(found)) => found,
        // Of a job or step no longer known: nobody will read it, and no buffer is touched.
        Ok(None) => {
            return Ok(Json(OutputAck {
                discard: true,
                ..Default::default()
            }))
        }
        Err(e) => {
            if e.kind == ErrorKind::PermissionDenied {
                tracing::warn!(node = %push.node, job = key.job, step = key.step, "output pushed for a step the node has no part in; refused");
            }
            return Err(e.into());
        }
    };
    let live = step.exit.is_none();
    let base = (idx as u32).saturating_mul(step.tasks_per_node);
    let now = crate::now_ms();
    Ok(Json(relay(&s).push(
        key,
        base,
        push.buffer,
        push.chunks,
        live,
        now,
    )))
}

/// `POST /v1/agent/steps/output/read`: the caller's agent fetches the step's output and
/// acknowledges what it passed on; the step comes with the answer once it ended and its
/// output is all read.
async fn step_output_read(
    State(s): State<Arc<Shared>>,
    Extension(AgentNode(me)): Extension<AgentNode>,
    bytes: Result<Bytes, BytesRejection>,
) -> ApiResult<OutputBatch> {
    let read: OutputRead = agent_request(&s, &me, bytes)?;
    let (key, node) = (read.key, read.node.clone());
    let step = with_cluster(&s, move |cl, _| cl.step_held_by(key, &node)).await?;
    Ok(Json(relay(&s).read(
        key,
        read.buffer,
        read.after,
        step,
        crate::now_ms(),
    )))
}

#[cfg(test)]
mod tests;
