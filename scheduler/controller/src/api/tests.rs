use std::sync::Mutex;

use tokio::sync::Notify;
use wharf_api::step::StepRequest;
use wharf_api::step_output::{PushChunk, Stream};
use wharf_api::wire::{AgentJob, PollRequest};
use wharf_api::{JobDefaults, JobRequest, NodeInfo};

use super::*;
use crate::cluster::Cluster;

/// A controller over nodes g1, g2 and g3, with job 1 running on g1 and g2 and its step 0
/// on g1 alone.
fn controller(dir: &tempfile::TempDir) -> (Arc<Shared>, StepKey) {
    let store = crate::store::Store::open(&dir.path().join("wharf.db")).unwrap();
    let mut c = Cluster::load(store, JobDefaults::default(), 60_000, 0).unwrap();
    for i in 1..=3 {
        let info = NodeInfo::new(
            &format!("g{i}"),
            &format!("10.0.0.{i}"),
            4,
            16 << 30,
            vec![],
        );
        c.register(info, 0).unwrap();
    }
    let ann = Caller {
        owner: Owner {
            uid: 1000,
            gid: 1000,
            user: "ann".into(),
        },
        admin: false,
    };
    let req = SubmitRequest {
        job: JobRequest {
            nodes: Some(2),
            cpus: Some(4),
            command: Some(vec!["/bin/true".into()]),
            image: Some("host".into()),
            ..Default::default()
        },
        cwd: "/tmp".into(),
        client_token: None,
        registry_auth: None,
    };
    let id = c.submit(&ann, &req, 10).unwrap();
    c.schedule(1_000).unwrap();
    for node in ["g1", "g2"] {
        let poll = PollRequest {
            node: node.into(),
            jobs: vec![AgentJob {
                id,
                start_time: Some(1_000),
                exit: None,
                end_time: None,
                stopping: false,
                ready: false,
            }],
            ..Default::default()
        };
        c.ingest(&poll, 2_000).unwrap();
    }
    let start = StepStart {
        node: "g1".into(),
        job: id,
        uid: 1000,
        request: StepRequest {
            argv: vec!["/bin/true".into()],
            nodelist: Some("g1".into()),
            ..Default::default()
        },
    };
    let step = c.start_step(start, 2_000).unwrap();
    assert_eq!(step.nodes.len(), 1);
    let (submits, _queue) = crate::submits::queue();
    let shared = Arc::new(Shared {
        config: crate::tests::config(dir.path()),
        cluster: Mutex::new(c),
        submits,
        scheduler: Notify::new(),
        next_pass: Mutex::new(std::time::Instant::now()),
        step_output: Default::default(),
        step_input: Default::default(),
        nodes: Mutex::default(),
    });
    (shared, StepKey { job: id, step: 0 })
}

fn agent_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("authorization", "Bearer token".parse().unwrap());
    h
}

async fn push(s: &Arc<Shared>, node: &str, key: StepKey, data: &[u8]) -> ApiResult<OutputAck> {
    let push = OutputPush {
        node: node.into(),
        key,
        buffer: 0,
        chunks: vec![PushChunk {
            task: 0,
            stream: Stream::Stdout,
            offset: 0,
            data: data.to_vec(),
        }],
    };
    let body = Bytes::from(serde_json::to_vec(&push).unwrap());
    step_output_push(State(s.clone()), agent_headers(), Ok(body)).await
}

#[tokio::test]
async fn only_the_nodes_holding_a_steps_tasks_may_pass_on_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let (s, key) = controller(&dir);
    let taken = push(&s, "g1", key, b"one\n").await.unwrap().0;
    assert!(!taken.discard, "{taken:?}");
    assert_eq!(taken.acks[0].next, 4);
    // g2 runs the step's job but none of its tasks; g3 runs nothing of it. Neither may add
    // to the step's output, nor turn its buffer to discarding (which stops its tasks).
    for stranger in ["g2", "g3"] {
        let Err(ApiFailure(status, refusal)) = push(&s, stranger, key, b"forged\n").await else {
            panic!("{stranger}'s push was taken");
        };
        assert_eq!(status, StatusCode::FORBIDDEN, "{refusal:?}");
        assert!(refusal.error.contains(stranger), "{refusal:?}");
    }
    // The step's own node goes on as before, and its caller gets exactly its output.
    let taken = push(&s, "g1", key, b"one\ntwo\n").await.unwrap().0;
    assert!(!taken.discard, "{taken:?}");
    assert_eq!(taken.acks[0].next, 8);
    let read = OutputRead {
        node: "g2".into(),
        key,
        buffer: 0,
        after: 0,
    };
    let body = Bytes::from(serde_json::to_vec(&read).unwrap());
    let batch = step_output_read(State(s.clone()), agent_headers(), Ok(body))
        .await
        .unwrap()
        .0;
    let got: Vec<u8> = batch.chunks.iter().flat_map(|c| c.data.clone()).collect();
    assert_eq!(got, b"one\ntwo\n");
    assert_eq!(batch.dropped, 0);
}

#[tokio::test]
async fn an_agents_body_over_its_limit_is_refused_as_too_large() {
    use tower_service::Service;
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = controller(&dir);
    let body = vec![b' '; s.config.max_agent_request_bytes + 1];
    let req = axum::http::Request::post("/v1/agent/steps/output")
        .header("authorization", "Bearer token")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    let answer = router(s).call(req).await.unwrap();
    // 413, which an agent tells from a wrong request: it pushes less and goes on.
    assert_eq!(answer.status(), StatusCode::PAYLOAD_TOO_LARGE);
}
