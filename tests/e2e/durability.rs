//! Acknowledged submits survive a `kill -9` of the controller; none is stored twice.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::*;

#[test]
fn controller_kill9_during_a_burst_of_500_submits_loses_nothing() {
    if !can_run("controller_kill9_during_a_burst_of_500_submits_loses_nothing") {
        return;
    }
    let mut c = Cluster::start();
    let (clients, per_client) = (4, 125);
    let acked: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
    let threads: Vec<_> = (0..clients)
        .map(|t| {
            let (socket, dir, acked) = (c.socket.clone(), c.dir.clone(), acked.clone());
            std::thread::spawn(move || {
                for n in 0..per_client {
                    let name = format!("burst-{t}-{n}");
                    // 64 CPUs never fit this node: the jobs stay pending and the test is about the store.
                    let out = std::process::Command::new(wharf_bin())
                        .args([
                            "submit",
                            "--json",
                            "--cpus",
                            "64",
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
                            .insert(name, v["id"].as_u64().unwrap());
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

    let out = c.wharf(&["queue", "--all", "--limit", "10000", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut stored: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for j in list["jobs"].as_array().unwrap() {
        stored
            .entry(j["name"].as_str().unwrap().to_string())
            .or_default()
            .push(j["id"].as_u64().unwrap());
    }
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
}
