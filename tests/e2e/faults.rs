//! Launch faults on live clusters: a node that cannot make a job's cgroup (its cgroup parent
//! runs through a file of the cgroup filesystem, which the kernel refuses to make a directory
//! under) is drained with the reason, and the job is requeued and runs on another node; a
//! gang with such a node is requeued as a whole; a command that does not exist fails its job
//! and leaves the node up.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::*;

/// Starts agent `name`; a broken one is given a cgroup parent under `cgroup.procs`, a file.
fn agent(c: &mut TcpCluster, name: &str, broken: bool) {
    let token = c.token();
    // Its own parent (the cluster removes it when dropped), or a path under a file in it.
    let mut cgroup = c.cgroup_parent_of(name);
    if broken {
        cgroup.push_str("/cgroup.procs");
    }
    c.agent_with(
        name,
        &token,
        &format!("cgroup_parent = \"{cgroup}\"\ngrace = \"2s\"\n"),
    );
}

fn nodes(c: &TcpCluster) -> Vec<Value> {
    let listed: Value =
        serde_json::from_slice(&c.wharf(&["nodes", "--json"]).stdout).expect("nodes --json");
    listed["nodes"].as_array().cloned().unwrap_or_default()
}

/// Waits until node `name` is listed and `ok` holds of it; returns it.
fn wait_node(c: &TcpCluster, name: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(n) = nodes(c).into_iter().find(|n| n["info"]["name"] == name) {
            if ok(&n) {
                return n;
            }
            assert!(Instant::now() < deadline, "node {name}: {n}\n{}", c.logs());
        }
        assert!(Instant::now() < deadline, "no node {name}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn job(c: &TcpCluster, id: u64) -> Value {
    show_json(&c.wharf(&["show", &id.to_string(), "--json"]), id)
}

/// Waits until job `id` is back in the queue after a failed launch; returns it.
fn requeued(c: &TcpCluster, id: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let j = job(c, id);
        if j["state"] == "PENDING" && j["restarts"] == 1 {
            return j;
        }
        assert!(Instant::now() < deadline, "job {id}: {j}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_node_that_cannot_make_cgroups_is_drained_and_the_job_runs_on_another() {
    if !can_run("a_node_that_cannot_make_cgroups_is_drained_and_the_job_runs_on_another") {
        return;
    }
    let mut c = TcpCluster::controller("wharf-fault-node-", "node_timeout = \"10s\"\n");
    agent(&mut c, "broken", true);
    wait_node(&c, "broken", |n| n["state"] == "UP");
    let id = submitted_id(&c.wharf(&[
        "submit",
        "--mem",
        "16M",
        "-t",
        "1m",
        "--wrap",
        "echo ran on $(hostname)",
    ]));
    let submitted = job(&c, id)["submit_time"].clone();
    let node = wait_node(&c, "broken", |n| n["state"] == "DRAIN");
    let reason = node["reason"].as_str().unwrap();
    assert!(
        reason.contains(&format!("launch of job {id} failed (cgroup)")),
        "{reason}"
    );
    let table = c.nodes();
    let row = table.lines().find(|l| l.contains("broken")).unwrap();
    assert!(row.contains("DRAIN") && row.contains("(cgroup)"), "{table}");
    // Back in the queue, as it was submitted, and never started.
    let j = requeued(&c, id);
    assert_eq!(j["submit_time"], submitted, "{j}");
    assert_eq!(j["launch_faults"], 1, "{j}");
    // Nothing starts on the drained node: the job waits for another.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(job(&c, id)["state"], "PENDING");

    agent(&mut c, "good", false);
    let done = wait_ended(|| job(&c, id), id, Duration::from_secs(60), || c.logs());
    assert_eq!(done["state"], "COMPLETED", "{done}");
    assert_eq!(done["allocs"][0]["node"], "good", "{done}");
    assert_eq!(done["restarts"], 1, "{done}");
    assert_eq!(done["submit_time"], submitted, "{done}");
    let out = std::fs::read_to_string(c.dir.path().join(format!("wharf-{id}.out"))).unwrap();
    assert_eq!(out, "ran on good\n");

    // A command that does not exist is the job's fault: it fails, the node stays up.
    let run = c.wharf(&["run", "--mem", "16M", "--", "/no/such/program"]);
    assert!(!run.status.success());
    let bad = id + 1;
    let j = job(&c, bad);
    assert_eq!(j["state"], "FAILED", "{j}");
    assert!(j["start_time"].is_null(), "{j}");
    assert!(
        j["reason"]
            .as_str()
            .unwrap()
            .contains("command not found in the image: /no/such/program"),
        "{j}"
    );
    assert_eq!(j["restarts"], Value::Null, "{j}");
    let good = wait_node(&c, "good", |_| true);
    assert_eq!(good["state"], "UP", "{good}");
    assert!(good["reason"].is_null(), "{good}");

    // An admin resumes the drained node.
    let out = c.wharf(&["nodes", "--resume", "broken"]);
    assert_eq!(stdout(&out), "node broken: UP\n", "{}", stderr(&out));
    let n = wait_node(&c, "broken", |_| true);
    assert!(n["reason"].is_null(), "{n}");
}

#[test]
fn a_gang_with_a_node_that_cannot_make_cgroups_is_requeued_as_a_whole() {
    if !can_run("a_gang_with_a_node_that_cannot_make_cgroups_is_requeued_as_a_whole") {
        return;
    }
    let mut c = TcpCluster::controller("wharf-fault-gang-", "node_timeout = \"10s\"\n");
    agent(&mut c, "ok1", false);
    agent(&mut c, "broken", true);
    wait_node(&c, "ok1", |n| n["state"] == "UP");
    wait_node(&c, "broken", |n| n["state"] == "UP");
    // Each rank records that it ran; the one on the good node may start before the other
    // fails, and is then stopped.
    let id = submitted_id(&c.wharf(&[
        "submit",
        "-N",
        "2",
        "--mem",
        "16M",
        "-t",
        "1m",
        "--wrap",
        "echo rank $SLURM_NODEID on $(hostname); sleep 2",
    ]));
    let node = wait_node(&c, "broken", |n| n["state"] == "DRAIN");
    assert!(
        node["reason"].as_str().unwrap().contains("(cgroup)"),
        "{node}"
    );
    let j = requeued(&c, id);
    assert!(j["allocs"].as_array().is_none_or(|a| a.is_empty()), "{j}");
    assert_eq!(wait_node(&c, "ok1", |_| true)["state"], "UP");

    // With a second good node the whole gang runs again, on the good nodes only.
    agent(&mut c, "ok2", false);
    let done = wait_ended(|| job(&c, id), id, Duration::from_secs(60), || c.logs());
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let mut on: Vec<&str> = done["allocs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["node"].as_str().unwrap())
        .collect();
    on.sort();
    assert_eq!(on, ["ok1", "ok2"], "{done}");
    assert_eq!(done["restarts"], 1, "{done}");
}
