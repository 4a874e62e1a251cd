//! Node selection on live clusters: a constrained job lands only on the node with the feature
//! and `--exclude` keeps a job off a node (two agents with their own features); a whole-node
//! job keeps a second job off its node; selections no node satisfies, and partitions closed to
//! a user's Unix groups, are refused at submit with words that say why.

use std::time::Duration;

use serde_json::Value;

use crate::harness::*;

#[test]
fn constraints_and_excluded_nodes_choose_among_two_agents() {
    if !can_run("constraints_and_excluded_nodes_choose_among_two_agents") {
        return;
    }
    let mut c = TcpCluster::controller("wharf-nodesel-", "node_timeout = \"10s\"\n");
    let token = c.token();
    c.agent_with("plain1", &token, "");
    c.agent_with("fast1", &token, "features = [\"ib\", \"nvme\"]");
    c.wait_nodes_up(2, 20);
    let nodes = c.nodes();
    assert!(
        nodes
            .lines()
            .any(|l| l.contains("fast1") && l.contains("ib,nvme")),
        "{nodes}"
    );
    let listed: Value = serde_json::from_slice(&c.wharf(&["nodes", "--json"]).stdout).unwrap();
    let fast = listed["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["info"]["name"] == "fast1")
        .unwrap();
    assert_eq!(fast["info"]["features"], serde_json::json!(["ib", "nvme"]));

    let submit = |opts: &[&str]| {
        let mut args = vec!["submit", "--mem", "16M", "-t", "1m"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&["--wrap", "true"]);
        submitted_id(&c.wharf(&args))
    };
    // Several of each, so that a job placed by chance would show.
    for _ in 0..3 {
        let on_ib = submit(&["-C", "ib&nvme"]);
        let not_fast = submit(&["--exclude", "fast[1]"]);
        let listed = submit(&["-w", "fast1", "-x", "plain1"]);
        for (id, node) in [(on_ib, "fast1"), (not_fast, "plain1"), (listed, "fast1")] {
            let job = c.wait_done(id, Duration::from_secs(30));
            assert_eq!(job["state"], "COMPLETED", "{job}");
            assert_eq!(job["allocs"][0]["node"], node, "{job}");
        }
    }
    let shown = stdout(&c.wharf(&["show", "1"]));
    assert!(shown.contains("Constraint: ib&nvme"), "{shown}");

    // What no node offers is refused at submit, saying what is missing.
    let out = c.wharf(&["submit", "-C", "gpu40g", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "Requested node configuration is not available: no node of partition default it \
             may use has the features gpu40g (features there: ib, nvme)"
        ),
        "{}",
        stderr(&out)
    );
    // A node both listed and excluded is a mistake; a list is every node of the job (as in
    // Slurm: its node count is raised to theirs), so a count over it is refused.
    for (args, says) in [
        (
            &["-w", "plain1,fast1", "-x", "plain1"][..],
            "node plain1 is both in --nodelist and in --exclude",
        ),
        (
            &["-N", "3", "-w", "plain1,fast1"][..],
            "--nodes 3 but --nodelist names 2 nodes",
        ),
    ] {
        let all = [&["submit"][..], args, &["--wrap", "true"]].concat();
        let out = c.wharf(&all);
        assert!(!out.status.success(), "{args:?}");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let both = submit(&["-w", "plain1,fast1"]);
    let job = c.wait_done(both, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let mut on = nodes_of(&job);
    on.sort_unstable();
    assert_eq!(on, ["fast1", "plain1"], "{job}");
    let out = c.wharf(&["submit", "-w", "fast[1-3]", "--wrap", "true"]);
    assert!(
        stderr(&out).contains("its --nodelist names fast[2-3], which are not a node"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf(&["submit", "-w", "fast[1-", "--wrap", "true"]);
    assert!(
        stderr(&out).contains("--nodelist: host list \"fast[1-\": a '[' is never closed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_exclusive_job_keeps_others_off_its_node_and_groups_guard_partitions() {
    let name = "an_exclusive_job_keeps_others_off_its_node_and_groups_guard_partitions";
    if !can_run(name) {
        return;
    }
    let (ann, bob) = (user("whnsel-ann"), user("whnsel-bob"));
    group("whnsel-gpu", &[&ann]);
    let c = Cluster::start_with(
        "features = [\"nvme\"]\n\
         [[scheduler.partition]]\nname = \"batch\"\ndefault = true\n\
         [[scheduler.partition]]\nname = \"gpu\"\nallow_groups = [\"whnsel-gpu\"]\n",
    );
    // Partition gpu is for members of whnsel-gpu: bob is refused, ann's job runs.
    let out = c.wharf_as(&bob, &["submit", "-p", "gpu", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "partition gpu allows members of groups whnsel-gpu only; whnsel-bob is in whnsel-bob"
        ),
        "{}",
        stderr(&out)
    );
    let id = submitted_id(&c.wharf_as(
        &ann,
        &["submit", "-p", "gpu", "--mem", "16M", "--wrap", "true"],
    ));
    let done = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");

    // A whole-node job: it holds every CPU and all memory, and a small job waits beside it.
    let nodes: Value = serde_json::from_slice(&c.wharf(&["nodes", "--json"]).stdout).unwrap();
    let node = &nodes["nodes"][0]["info"];
    let node_name = node["name"].as_str().unwrap().to_string();
    let whole = submitted_id(&c.wharf_as(
        &ann,
        &[
            "submit",
            "--exclusive",
            "-C",
            "nvme",
            "-w",
            &node_name,
            "--mem",
            "16M",
            "-t",
            "2m",
            "--wrap",
            "sleep 120",
        ],
    ));
    c.wait_running(whole);
    let job = c.job(whole);
    assert_eq!(job["resources"]["cpus"], node["cpus"], "{job}");
    assert_eq!(job["resources"]["memory"], node["memory"], "{job}");
    let shown = stdout(&c.wharf_as(&ann, &["show", &whole.to_string()]));
    assert!(
        shown.contains("Exclusive: yes") && shown.contains(&format!("Nodelist: {node_name}")),
        "{shown}"
    );
    let small = submitted_id(&c.wharf_as(
        &bob,
        &["submit", "--mem", "16M", "-t", "1m", "--wrap", "true"],
    ));
    std::thread::sleep(Duration::from_secs(2));
    let waiting = c.job(small);
    assert_eq!(waiting["state"], "PENDING", "{waiting}");
    let reason = waiting["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("Resources: "), "{reason}");
    // When the whole-node job ends, the small one runs.
    assert!(c.wharf(&["cancel", &whole.to_string()]).status.success());
    let done = c.wait_done(small, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
}
