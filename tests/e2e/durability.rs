//! Acknowledged submits survive a `kill -9` of the controller; none is stored twice.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::*;

/// POSTs a submit with `token` over the socket; returns the id the controller answers.
fn submit_with_token(socket: &Path, token: &str) -> u64 {
    let body = format!(
        r#"{{"job": {{"command": ["/bin/true"], "name": "token-{token}"}}, "cwd": "/tmp", "client_token": "{token}"}}"#
    );
    let (_, answer) = post_submit(socket, &body);
    let json = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {answer}"));
    v["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no id: {answer}"))
}

/// POSTs a submit `body` over the socket; returns the HTTP status and the whole answer.
fn post_submit(socket: &Path, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    write!(
        s,
        "POST /v1/jobs HTTP/1.1\r\nHost: wharf\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {answer:?}"));
    (status, answer)
}

/// The ids of every stored job (active or ended), by name.
fn stored_by_name(c: &Cluster) -> BTreeMap<String, Vec<u64>> {
    let out = c.wharf(&["queue", "--all", "--limit", "10000", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut stored: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for j in list["jobs"].as_array().unwrap() {
        stored
            .entry(j["name"].as_str().unwrap().to_string())
            .or_default()
            .push(j["id"].as_u64().unwrap());
    }
    stored
}

#[test]
fn one_client_token_is_one_job() {
    if !can_run("one_client_token_is_one_job") {
        return;
    }
    let mut c = Cluster::start();
    let first = submit_with_token(&c.socket, "whctl-token-a");
    assert_eq!(submit_with_token(&c.socket, "whctl-token-a"), first);
    let other = submit_with_token(&c.socket, "whctl-token-b");
    assert_ne!(other, first);
    // The token outlives the controller.
    c.kill9();
    c.spawn();
    c.wait_node_up();
    assert_eq!(submit_with_token(&c.socket, "whctl-token-a"), first);
    let out = c.wharf(&["queue", "--all", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let named = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["name"] == "token-whctl-token-a")
        .count();
    assert_eq!(named, 1, "one token, one job: {list}");
}

#[test]
fn controller_kill9_during_a_burst_of_500_submits_loses_nothing() {
    if !can_run("controller_kill9_during_a_burst_of_500_submits_loses_nothing") {
        return;
    }
    let mut c = Cluster::start();
    // One job holds every CPU, so that the burst (asking for all of them) stays pending: the
    // test is about the store.
    let cpus = c.node_cpus().to_string();
    let blocker = submitted_id(&c.wharf(&["submit", "--cpus", &cpus, "--wrap", "sleep 600"]));
    c.wait_running(blocker);
    let (clients, per_client) = (4, 125);
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let retried: Arc<Mutex<Vec<String>>> = Arc::default();
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let (socket, dir, acked, retried) = (
                c.socket.clone(),
                c.dir.clone(),
                acked.clone(),
                retried.clone(),
            );
            let cpus = cpus.clone();
            std::thread::spawn(move || {
                for n in 0..per_client {
                    let name = format!("burst-{t}-{n}");
                    let out = std::process::Command::new(wharf_bin())
                        .args([
                            "submit",
                            "--json",
                            "--cpus",
                            &cpus,
                            "--job-name",
                            &name,
                            "--wrap",
                            "true",
                        ])
                        .env("WHARF_SOCKET", &socket)
                        .current_dir(&dir)
                        .output()
                        .unwrap();
                    if out.status.success() {
                        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                        acked
                            .lock()
                            .unwrap()
                            .insert(name.clone(), v["id"].as_u64().unwrap());
                        // The CLI says when it could not reach the controller and tries again.
                        if String::from_utf8_lossy(&out.stderr).contains("retrying") {
                            retried.lock().unwrap().push(name);
                        }
                    }
                }
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while acked.lock().unwrap().len() < 120 {
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than 120 submits acknowledged in 60 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    c.kill9();
    let at_kill = acked.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(500));
    c.spawn();
    for t in threads {
        t.join().unwrap();
    }
    c.wait_node_up();
    let acked = acked.lock().unwrap().clone();
    assert!(
        at_kill < clients * per_client,
        "the kill came after the burst"
    );
    assert_eq!(
        acked.len(),
        clients * per_client,
        "every submit is eventually acknowledged (the CLI retries)"
    );
    let retried = retried.lock().unwrap().clone();
    assert!(
        !retried.is_empty(),
        "no client retried across the kill: the test did not test the retry"
    );

    let mut stored = stored_by_name(&c);
    stored.retain(|name, _| name.starts_with("burst-"));
    for (name, id) in &acked {
        assert_eq!(
            stored.get(name),
            Some(&vec![*id]),
            "{name} acknowledged as job {id}"
        );
    }
    assert_eq!(
        stored.values().map(Vec::len).sum::<usize>(),
        clients * per_client,
        "a job was stored twice"
    );
    eprintln!(
        "{} of {} submits retried across the kill",
        retried.len(),
        acked.len()
    );
    let ok = c.wharf(&["cancel", &blocker.to_string()]);
    assert!(ok.status.success(), "{}", stderr(&ok));
}

#[test]
fn concurrent_submits_are_each_durable_and_a_bad_one_fails_alone() {
    if !can_run("concurrent_submits_are_each_durable_and_a_bad_one_fails_alone") {
        return;
    }
    let mut c = Cluster::start();
    // 16 clients at once, so that submits are committed in groups; every fifth asks for more
    // CPUs than any node has. Held, the jobs stay pending: the test is about the store.
    let (clients, per_client) = (16, 25);
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let socket = c.socket.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for n in 0..per_client {
                    let name = format!("group-{t}-{n}");
                    let bad = n % 5 == 4;
                    let cpus = if bad { 100_000 } else { 1 };
                    let body = format!(
                        r#"{{"job": {{"command": ["/bin/true"], "name": "{name}", "cpus": {cpus}, "hold": true}}, "cwd": "/tmp", "client_token": "{name}"}}"#
                    );
                    let (status, answer) = post_submit(&socket, &body);
                    answers.push((name, bad, status, answer));
                }
                answers
            })
        })
        .collect();
    let answers: Vec<(String, bool, u16, String)> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    // Killed right after the last answer: every acknowledged submit must be on disk.
    c.kill9();
    c.spawn();
    c.wait_node_up();
    let stored = stored_by_name(&c);
    let mut acked = 0;
    for (name, bad, status, answer) in &answers {
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        if *bad {
            assert_eq!(*status, 400, "{name}: {answer}");
            assert!(body.contains("100000 CPUs"), "{name}: {answer}");
            assert_eq!(stored.get(name), None, "{name} was refused yet stored");
        } else {
            assert_eq!(*status, 201, "{name}: {answer}");
            let id = v["id"].as_u64().unwrap();
            assert_eq!(
                stored.get(name),
                Some(&vec![id]),
                "{name} acknowledged as job {id}"
            );
            acked += 1;
        }
    }
    assert_eq!(acked, clients * per_client * 4 / 5);
}
