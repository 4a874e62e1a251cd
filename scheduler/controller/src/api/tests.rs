use wharf_api::step::StepRequest;
use wharf_api::step_output::{PushChunk, Stream};
use wharf_api::NodeInfo;

use super::*;

/// A controller over nodes g1, g2 and g3, with job 1 running on g1 and g2 and its step 0
/// on g1 alone.
fn controller(dir: &tempfile::TempDir) -> (Arc<Shared>, StepKey) {
    use crate::cluster::steps::tests::{ask, nodes, running, started};
    let mut c = nodes(dir, 3);
    let id = running(&mut c, 2);
    let only_g1 = StepRequest {
        nodelist: Some("g1".into()),
        ..Default::default()
    };
    let step = c
        .start_step(ask(id, "g1", 1000, only_g1), 2_000)
        .map(started)
        .unwrap();
    assert_eq!(step.nodes.len(), 1);
    let (shared, _queue) = crate::tests::shared(dir.path(), c);
    (shared, StepKey { job: id, step: 0 })
}

/// The key node `node`'s agent would hold, known to the controller.
fn key_of(s: &Shared, node: &str) -> String {
    let hex: String = crate::node_keys::hash(node)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let key = format!("{}{hex}", wharf_api::wire::NODE_KEY_PREFIX);
    s.node_keys.insert(node, crate::node_keys::hash(&key));
    key
}

fn bearer(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("authorization", format!("Bearer {token}").parse().unwrap());
    h
}

/// The headers of node `node`'s agent.
/// What [`agents_only`] passes a handler for a request with `node`'s key (handlers called
/// directly; the key checks themselves go through the router in the tests below).
fn as_agent(node: &str) -> Extension<AgentNode> {
    Extension(AgentNode(node.into()))
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
    step_output_push(State(s.clone()), as_agent(node), Ok(body)).await
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
    let batch = step_output_read(State(s.clone()), as_agent("g2"), Ok(body))
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
    let key = key_of(&s, "g1");
    let req = axum::http::Request::post("/v1/agent/steps/output")
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .unwrap();
    let answer = router(s).call(req).await.unwrap();
    // 413, which an agent tells from a wrong request: it pushes less and goes on.
    assert_eq!(answer.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

/// Sends `body` to `path` through the router with `auth` as the bearer token; the status
/// and the answer's JSON.
async fn call(
    s: &Arc<Shared>,
    path: &str,
    auth: &str,
    body: serde_json::Value,
) -> (StatusCode, serde_json::Value) {
    use tower_service::Service;
    let req = axum::http::Request::post(path)
        .header("authorization", format!("Bearer {auth}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let answer = router(s.clone()).call(req).await.unwrap();
    let status = answer.status();
    let bytes = axum::body::to_bytes(answer.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

fn poll_of(node: &str) -> serde_json::Value {
    serde_json::json!({"node": node, "jobs": [], "wait_ms": 0, "images": []})
}

/// A key in its form, `n` giving its bytes.
fn made_key(n: u8) -> String {
    crate::node_keys::tests::key(n)
}

fn join_of(node: &str, key: &str) -> serde_json::Value {
    serde_json::json!({ "node": node, "key": key })
}

/// The join token takes a node's key once (again only the same key), and only joins; a key
/// speaks for its own node only. On the old code the join token reached every agent route,
/// and any agent could poll (and take the launch orders, registry credentials included) in
/// any node's name.
#[tokio::test]
async fn the_join_token_only_joins_and_a_nodes_key_speaks_only_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let (s, key) = controller(&dir);
    // The join token reaches no other agent route.
    let (status, why) = call(&s, "/v1/agent/poll", "token", poll_of("g1")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{why}");
    assert!(
        why["error"].as_str().unwrap().contains("only joins"),
        "{why}"
    );
    // A node joins with the key its agent made; the same join again (its answer lost) is
    // taken, another key for the name is not.
    let g1 = made_key(1);
    for _ in 0..2 {
        let (status, got) = call(&s, "/v1/agent/join", "token", join_of("g1", &g1)).await;
        assert_eq!(status, StatusCode::OK, "{got}");
        assert_eq!(got["node"], "g1");
    }
    let (status, why) = call(&s, "/v1/agent/join", "token", join_of("g1", &made_key(2))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{why}");
    assert!(
        why["error"].as_str().unwrap().contains("--forget-key g1"),
        "{why}"
    );
    // A key not in a key's form is refused.
    for weak in ["wnk_00", "", &g1.to_uppercase(), "token"] {
        let (status, _) = call(&s, "/v1/agent/join", "token", join_of("g5", weak)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{weak:?}");
    }
    // The store holds the key's hash, never the key: in the database and its write-ahead
    // log, where the row sits until a checkpoint (the hash found there shows it is read).
    let mut db = Vec::new();
    for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
        if f.file_name().to_string_lossy().starts_with("wharf.db") {
            db.extend(std::fs::read(f.path()).unwrap());
        }
    }
    let hashed = crate::node_keys::hash(&g1);
    assert!(db.windows(hashed.len()).any(|w| w == hashed));
    assert!(!db.windows(g1.len()).any(|w| w == g1.as_bytes()));
    // A key joins nothing. A key nobody holds, or none, is 401 (the agent's cue to join
    // again); a wrong join token too.
    let (status, _) = call(&s, "/v1/agent/join", &g1, join_of("g9", &made_key(9))).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    for wrong in ["", "wnk_00", "tokenx", &made_key(3)] {
        let (status, _) = call(&s, "/v1/agent/poll", wrong, poll_of("g1")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{wrong:?}");
    }
    // g1's key polls as g1, and as no other node.
    let (status, got) = call(&s, "/v1/agent/poll", &g1, poll_of("g1")).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    for other in ["g2", "g3", "g1 "] {
        let (status, why) = call(&s, "/v1/agent/poll", &g1, poll_of(other)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{other:?}: {why}");
        assert!(
            why["error"].as_str().unwrap().contains("speaks for node"),
            "{why}"
        );
    }
    // Nor may it read or cancel a step of a job it holds no part of: g3 runs nothing of job 1.
    let g3 = key_of(&s, "g3");
    let step = serde_json::to_value(key).unwrap();
    for path in ["/v1/agent/steps/status", "/v1/agent/steps/cancel"] {
        let (status, why) = call(&s, path, &g3, step.clone()).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {why}");
    }
    let (status, got) = call(&s, "/v1/agent/steps/status", &g1, step.clone()).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert!(got["exit"].is_null(), "g3's cancel stopped the step: {got}");
    // Names a node may not have.
    for bad in ["", "a/b", "a\nb", "\u{1b}[2J"] {
        let (status, _) = call(&s, "/v1/agent/join", "token", join_of(bad, &made_key(4))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}");
    }
}

/// An admin forgets a node's key, registered or not: the old key reaches nothing, and the
/// node may join again. Keys outlive a restart of the controller.
#[tokio::test]
async fn a_forgotten_key_is_refused_and_keys_outlive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = controller(&dir);
    // g7 joins and never registers (its agent stopped between the two).
    for (node, n) in [("g2", 2), ("g7", 7)] {
        let (status, got) = call(&s, "/v1/agent/join", "token", join_of(node, &made_key(n))).await;
        assert_eq!(status, StatusCode::OK, "{got}");
    }
    let g2 = made_key(2);
    // g2's agent registers with its key (before it joined, g2 registered without one).
    let info = serde_json::json!({ "node": NodeInfo::new("g2", "127.0.0.1", 8, 16 << 30, vec![]) });
    let (status, got) = call(&s, "/v1/agent/register", &g2, info).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    // Read back as a restarted controller would.
    let store = crate::store::Store::open(&dir.path().join("wharf.db")).unwrap();
    let again = crate::node_keys::NodeKeys::new("token", store.node_keys().unwrap());
    assert_eq!(
        again.check(&bearer(&g2)),
        Some(crate::node_keys::Credential::Node("g2".into()))
    );
    let forget = |uid: u32, node: &str| {
        let s = s.clone();
        let node = node.to_string();
        async move {
            forget_key(
                State(s),
                ConnectInfo(Peer::Local { uid, gid: uid }),
                Path(node),
            )
            .await
        }
    };
    // An admin sees who joined, and that g7 never registered; a user sees nothing.
    let list = |uid: u32| {
        let s = s.clone();
        async move { node_keys(State(s), ConnectInfo(Peer::Local { uid, gid: uid })).await }
    };
    let Err(ApiFailure(status, _)) = list(1000).await else {
        panic!("a user listed the nodes' keys");
    };
    assert_eq!(status, StatusCode::FORBIDDEN);
    let keys = list(0).await.unwrap().0.keys;
    let seen: Vec<(&str, bool)> = keys
        .iter()
        .map(|k| (k.node.as_str(), k.registered.is_some()))
        .collect();
    assert_eq!(seen, [("g2", true), ("g7", false)]);
    assert!(keys.iter().all(|k| k.joined > 0));
    // Only an admin may forget one.
    let Err(ApiFailure(status, _)) = forget(1000, "g2").await else {
        panic!("a user forgot a node's key");
    };
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = call(&s, "/v1/agent/poll", &g2, poll_of("g2")).await;
    assert_eq!(status, StatusCode::OK);
    for node in ["g2", "g7"] {
        assert_eq!(forget(0, node).await.unwrap().0.node, node);
    }
    let (status, _) = call(&s, "/v1/agent/poll", &g2, poll_of("g2")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Forgotten once, it is not there to forget again.
    let Err(ApiFailure(status, why)) = forget(0, "g2").await else {
        panic!("forgot a key twice");
    };
    assert_eq!(status, StatusCode::NOT_FOUND, "{why:?}");
    let store = crate::store::Store::open(&dir.path().join("wharf.db")).unwrap();
    assert!(store.node_keys().unwrap().is_empty());
    assert!(list(0).await.unwrap().0.keys.is_empty());
    // The node joins again, with a new key.
    let (status, got) = call(&s, "/v1/agent/join", "token", join_of("g2", &made_key(5))).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    let (status, _) = call(&s, "/v1/agent/poll", &made_key(5), poll_of("g2")).await;
    assert_eq!(status, StatusCode::OK);
}

/// A step that starts owns nothing the relays held under its key: a requeued job numbers its
/// steps from 0 again, and an earlier run's closed ranks (or buffers) would otherwise starve
/// the new step's readers.
#[tokio::test]
async fn a_new_step_starts_with_nothing_of_an_earlier_one_under_its_key() {
    use crate::cluster::steps::tests::ask;
    let dir = tempfile::tempdir().unwrap();
    let (s, old) = controller(&dir);
    let next = StepKey {
        job: old.job,
        step: old.step + 1,
    };
    s.step_input.lock().unwrap().closed(next, &[0, 1], 1);
    let chunk = PushChunk {
        task: 0,
        stream: Stream::Stdout,
        offset: 0,
        data: b"old run\n".to_vec(),
    };
    relay(&s).push(next, 0, 0, vec![chunk], true, 1);
    assert!(relay(&s).held() > 0);
    let start = ask(old.job, "g1", 1000, StepRequest::default());
    let body = Bytes::from(serde_json::to_vec(&start).unwrap());
    let step = step_start(State(s.clone()), as_agent("g1"), Ok(body))
        .await
        .unwrap()
        .0;
    assert_eq!(step.id, next.step);
    assert!(
        !s.step_input.lock().unwrap().knows_closed(next),
        "the new step inherited closed ranks"
    );
    assert_eq!(relay(&s).held(), 0, "the new step inherited output");
}

/// The API takes a job as `ID` or `ARRAYID_TASKID` in digits only: before, `+5` was job 5,
/// and a percent-escaped id (`%35`, decoded by the router) was taken as written.
#[test]
fn a_job_in_a_path_is_digits_or_an_array_task() {
    assert_eq!(job_id("12").ok(), Some((12, None)));
    assert_eq!(job_id("12_3").ok(), Some((12, Some(3))));
    for bad in ["+5", "5 ", " 5", "1_+2", "-1", "1?x=1", "", "_", "1_"] {
        let e = job_id(bad).err().unwrap_or_else(|| panic!("{bad:?} taken"));
        assert_eq!(e.1.kind, ErrorKind::InvalidInput, "{bad:?}");
    }
}

#[test]
fn a_listing_names_at_most_a_hundred_users_each_once() {
    let query = |users: String| -> ListQuery {
        serde_json::from_value(serde_json::json!({ "users": users })).unwrap()
    };
    let many: Vec<String> = (0..101).map(|i| format!("nobody{i}")).collect();
    let err = query(many.join(",")).filter().unwrap_err();
    assert!(format!("{err:?}").contains("101 users named"), "{err:?}");
    // Named twice is named once; a hundred is the most.
    let twice = format!("{},{}", many[..100].join(","), many[0]);
    let f = query(twice).filter().unwrap();
    assert_eq!(f.users.len() + f.uids.len(), 100);
}
