use wharf_api::step::StepRequest;
use wharf_api::step_output::{PushChunk, Stream};

use super::*;

/// A controller over nodes g1, g2 and g3, with job 1 running on g1 and g2 and its step 0
/// on g1 alone.
fn controller(dir: &tempfile::TempDir) -> (Arc<Shared>, StepKey) {
    use crate::cluster::steps::tests::{ask, nodes, running};
    let mut c = nodes(dir, 3);
    let id = running(&mut c, 2);
    let only_g1 = StepRequest {
        nodelist: Some("g1".into()),
        ..Default::default()
    };
    let step = c.start_step(ask(id, "g1", 1000, only_g1), 2_000).unwrap();
    assert_eq!(step.nodes.len(), 1);
    let (shared, _queue) = crate::tests::shared(dir.path(), c);
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
