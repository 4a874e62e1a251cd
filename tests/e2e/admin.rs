//! `wharf admin`: associations changed over the CLI at run time hold jobs to their limits at
//! the next pass, survive a controller restart, are audited with who and the old and new
//! values, and only admins (and an account's coordinators, for its users) may make them.

use std::time::{Duration, Instant};

use crate::harness::*;

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}\n{}", stdout(out), stderr(out));
    stdout(out)
}

fn refused(out: &std::process::Output, want: &str) {
    assert!(!out.status.success(), "{}", stdout(out));
    assert!(stderr(out).contains(want), "want {want:?}: {}", stderr(out));
}

/// Waits until job `id`'s reason starts with `want`.
fn wait_reason(c: &Cluster, id: u64, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let job = c.job(id);
        if job["reason"].as_str().unwrap_or_default().starts_with(want) {
            assert_eq!(job["state"], "PENDING", "{job}");
            return;
        }
        assert!(Instant::now() < deadline, "{job}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn audit(c: &Cluster) -> Vec<serde_json::Value> {
    let out = c.wharf(&["admin", "audit", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    v["entries"].as_array().unwrap().clone()
}

#[test]
fn associations_made_over_the_cli_limit_jobs_survive_a_restart_and_are_audited() {
    let name = "associations_made_over_the_cli_limit_jobs_survive_a_restart_and_are_audited";
    if !can_run(name) {
        return;
    }
    let mut c = Cluster::start();
    if !c.has_cpus(name, 2) {
        return;
    }
    let (ann, coord, eve) = (user("whadm-ann"), user("whadm-coord"), user("whadm-eve"));

    // An admin (root) builds a tree: lab (1 CPU for all its jobs) with sub below it.
    ok(&c.wharf(&[
        "admin",
        "account",
        "add",
        "lab",
        "--shares",
        "2",
        "--grp-tres",
        "cpu=1",
        "--coordinator",
        "whadm-coord",
    ]));
    ok(&c.wharf(&["admin", "account", "add", "sub", "--parent", "lab"]));
    ok(&c.wharf(&["admin", "account", "add", "other"]));
    ok(&c.wharf(&["admin", "user", "add", "whadm-coord", "--account", "lab"]));
    // Nonsense changes nothing.
    refused(
        &c.wharf(&["admin", "account", "add", "x", "--parent", "nope"]),
        "parent \"nope\" is not an account",
    );
    refused(
        &c.wharf(&["admin", "account", "modify", "lab", "--parent", "sub"]),
        "would make a cycle",
    );
    refused(
        &c.wharf(&["admin", "qos", "add", "gold", "--preempt", "silver"]),
        "preempt names \"silver\", which is not a QoS",
    );

    // The coordinator adds a user to a sub-account of theirs, not to another account, and
    // may not touch QoS or accounts.
    ok(&c.wharf_as(
        &coord,
        &["admin", "user", "add", "whadm-ann", "--account", "sub"],
    ));
    refused(
        &c.wharf_as(
            &coord,
            &["admin", "user", "add", "whadm-eve", "--account", "other"],
        ),
        "may add users of account other; as coordinator of lab",
    );
    refused(
        &c.wharf_as(&coord, &["admin", "qos", "add", "gold"]),
        "only an admin (root or a user in [controller] admins) may add QoS",
    );
    // Nor move a user's default account to theirs: that decides where the user's jobs are
    // charged in accounts the coordinator does not manage.
    refused(
        &c.wharf_as(
            &coord,
            &[
                "admin",
                "user",
                "modify",
                "whadm-ann",
                "--account",
                "sub",
                "--default",
            ],
        ),
        "only an admin (root or a user in [controller] admins) may set user whadm-ann's default account",
    );
    refused(
        &c.wharf_as(
            &eve,
            &["admin", "account", "modify", "lab", "--shares", "5"],
        ),
        "only an admin",
    );
    refused(&c.wharf_as(&eve, &["admin", "audit"]), "only an admin");
    // Eve is in no account: her jobs are refused.
    refused(
        &c.wharf_as(&eve, &["submit", "--wrap", "true"]),
        "user whadm-eve is in no account",
    );

    // A QoS that preempts others is named only where an admin allows it: not by ann (her
    // associations allow none), not granted by her coordinator, then allowed for lab and so
    // for its sub-account.
    ok(&c.wharf(&["admin", "qos", "add", "scavenger"]));
    ok(&c.wharf(&["admin", "qos", "add", "urgent", "--preempt", "scavenger"]));
    let urgent = ["submit", "--hold", "-q", "urgent", "--wrap", "true"];
    refused(
        &c.wharf_as(&ann, &urgent),
        "QoS urgent is not allowed for user whadm-ann in account sub: it may name no QoS",
    );
    refused(
        &c.wharf_as(
            &coord,
            &["admin", "user", "modify", "whadm-ann", "--account", "sub", "--qos", "urgent"],
        ),
        "only an admin (root or a user in [controller] admins) may set which QoS user whadm-ann may use",
    );
    refused(
        &c.wharf(&["admin", "account", "modify", "lab", "--qos", "gold"]),
        "qos names \"gold\", which is not a QoS",
    );
    ok(&c.wharf(&["admin", "account", "modify", "lab", "--qos", "urgent"]));
    let held = submitted_id(&c.wharf_as(&ann, &urgent));
    assert_eq!(c.job(held)["spec"]["qos"], "urgent");
    ok(&c.wharf(&["cancel", &held.to_string()]));
    let shown = ok(&c.wharf(&["admin", "account", "show", "lab"]));
    assert!(shown.contains("qos=urgent"), "{shown}");

    // Ann's jobs run under lab's limit: the second waits with Slurm's reason.
    let submit = |cpus: &str, script: &str| {
        submitted_id(&c.wharf_as(
            &ann,
            &[
                "submit", "--cpus", cpus, "--mem", "16M", "-t", "10m", "--wrap", script,
            ],
        ))
    };
    let first = submit("1", "sleep 600");
    c.wait_running(first);
    let second = submit("1", "true");
    let reason = "AssocGrpCpuLimit: account lab allows 1 CPU";
    wait_reason(&c, second, reason);
    // Submitted without -A: charged to her default account, named in the job at submit.
    assert_eq!(c.job(first)["spec"]["account"], "sub");

    // A restart keeps the associations (the config file has none) and the limit.
    c.kill9();
    c.spawn();
    c.wait_node_up();
    let shown: serde_json::Value =
        serde_json::from_str(&ok(&c.wharf(&["admin", "account", "show", "lab", "--json"])))
            .unwrap();
    let names: Vec<&str> = shown
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["lab", "sub"], "{shown}");
    assert_eq!(shown[0]["limits"]["grp_tres"]["cpu"], 1, "{shown}");
    assert_eq!(shown[0]["source"], "database");
    let tree = ok(&c.wharf(&["admin", "account", "show"]));
    assert!(tree.contains("  sub"), "sub is shown below lab:\n{tree}");
    std::thread::sleep(Duration::from_secs(2));
    wait_reason(&c, second, reason);

    // Removals wait for users, children and jobs.
    refused(
        &c.wharf(&["admin", "account", "rm", "lab"]),
        "account lab has child account sub",
    );
    refused(
        &c.wharf(&["admin", "user", "rm", "whadm-ann", "--account", "sub"]),
        "pending or running jobs",
    );

    // Lifting the limit starts the second job at the next pass, without a restart.
    ok(&c.wharf(&[
        "admin",
        "account",
        "modify",
        "lab",
        "--grp-tres",
        "cpu=none",
    ]));
    let done = c.wait_done(second, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    ok(&c.wharf(&["cancel", &first.to_string()]));

    // A drained partition takes no new jobs.
    ok(&c.wharf(&["admin", "partition", "add", "batch", "--max-time", "1h"]));
    ok(&c.wharf(&["admin", "partition", "modify", "batch", "--state", "DRAIN"]));
    refused(
        &c.wharf_as(&ann, &["submit", "--wrap", "true"]),
        "partition batch takes no new jobs",
    );

    // A partition may name nodes that have not joined (yet): taken, with a warning naming
    // them; before, a misspelt node was taken without a word.
    let nodes: serde_json::Value =
        serde_json::from_str(&ok(&c.wharf(&["nodes", "--json"]))).unwrap();
    let node = nodes["nodes"][0]["info"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let both = format!("{node},nosuchnode");
    let out = c.wharf(&["admin", "partition", "add", "long", "--nodes", &both]);
    ok(&out);
    assert!(
        stderr(&out).contains("partition long names nodes that have not registered: nosuchnode;"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf(&[
        "admin",
        "partition",
        "modify",
        "long",
        "--nodes",
        "nosuch1,nosuch2",
    ]);
    ok(&out);
    assert!(
        stderr(&out).contains("have not registered: nosuch1,nosuch2;"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf(&["admin", "partition", "modify", "long", "--nodes", &node]);
    ok(&out);
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));

    // Draining and resuming a node are audited too.
    ok(&c.wharf(&["nodes", "--drain", &node, "--reason", "bad fan"]));
    ok(&c.wharf(&["nodes", "--resume", &node]));

    // Every change is audited, with who and the values before and after.
    let entries = audit(&c);
    let find = |command: &str| {
        entries
            .iter()
            .find(|e| e["command"].as_str().unwrap().starts_with(command))
            .unwrap_or_else(|| panic!("no {command:?} in {entries:?}"))
            .clone()
    };
    let add = find("account add lab");
    assert_eq!(
        (add["uid"].as_u64(), add["user"].as_str()),
        (Some(0), Some("root"))
    );
    assert_eq!(add["old"], serde_json::Value::Null);
    assert_eq!(add["new"]["limits"]["grp_tres"]["cpu"], 1);
    let by_coord = find("user add whadm-ann account=sub");
    assert_eq!(by_coord["user"], "whadm-coord");
    assert_eq!(by_coord["uid"], coord.uid);
    let lifted = find("account modify lab grp_tres");
    assert_eq!(lifted["old"]["limits"]["grp_tres"]["cpu"], 1);
    assert_eq!(
        lifted["new"]["limits"]["grp_tres"]["cpu"],
        serde_json::Value::Null
    );
    let drained = find("partition modify batch");
    assert_eq!(
        (
            drained["old"]["state"].as_str(),
            drained["new"]["state"].as_str()
        ),
        (Some("UP"), Some("DRAIN"))
    );
    let drain = find(&format!("node drain {node} reason=bad fan"));
    assert_eq!(
        (drain["user"].as_str(), drain["kind"].as_str()),
        (Some("root"), Some("node"))
    );
    assert_eq!(
        (
            drain["old"]["state"].as_str(),
            drain["new"]["state"].as_str()
        ),
        (Some("UP"), Some("DRAIN"))
    );
    assert_eq!(drain["new"]["reason"], "bad fan [by root]");
    let resume = find(&format!("node resume {node}"));
    assert_eq!(
        (
            resume["old"]["state"].as_str(),
            resume["new"]["state"].as_str()
        ),
        (Some("DRAIN"), Some("UP"))
    );
    assert!(
        resume["time"].as_u64() >= drain["time"].as_u64(),
        "{resume}"
    );
    let allowed = find("account modify lab qos");
    assert_eq!(
        allowed["new"]["limits"]["qos"],
        serde_json::json!(["urgent"])
    );
    assert_eq!(
        entries.len(),
        16,
        "refused changes are not audited: {entries:?}"
    );
    let table = ok(&c.wharf(&["admin", "audit"]));
    assert!(
        table.contains("limits.grp_tres.cpu: 1 -> -"),
        "the table shows old -> new:\n{table}"
    );
    assert!(
        table.contains(&format!("node resume {node}")) && table.contains("state: DRAIN -> UP"),
        "{table}"
    );
}

#[test]
fn a_spent_account_budget_holds_jobs_with_its_reason_and_bad_budgets_change_nothing() {
    let name = "a_spent_account_budget_holds_jobs_with_its_reason_and_bad_budgets_change_nothing";
    if !can_run(name) {
        return;
    }
    let c = Cluster::start();
    if !c.has_cpus(name, 2) {
        return;
    }
    let ann = user("whbud-ann");
    ok(&c.wharf(&[
        "admin",
        "account",
        "add",
        "budgeted",
        "--grp-tres-mins",
        "cpu=30",
    ]));
    ok(&c.wharf(&["admin", "user", "add", "whbud-ann", "--account", "budgeted"]));
    for (bad, want) in [
        ("cpu=-1", "whole number of minutes"),
        ("cpu=10,mem=5", "unknown TRES \"mem\""),
        ("garbage", "write TRES=MINUTES"),
    ] {
        refused(
            &c.wharf(&[
                "admin",
                "account",
                "modify",
                "budgeted",
                "--grp-tres-mins",
                bad,
            ]),
            want,
        );
    }
    let shown = ok(&c.wharf(&["admin", "account", "show", "budgeted"]));
    assert!(shown.contains("grp_tres_mins=cpu=30"), "{shown}");

    let submit = |time: &str, script: &str| {
        c.wharf_as(
            &ann,
            &[
                "submit", "--cpus", "1", "--mem", "16M", "-t", time, "--wrap", script,
            ],
        )
    };
    // 40 CPU-minutes could never fit a budget of 30.
    refused(
        &submit("40m", "true"),
        "could never start: AssocGrpCPUMinutes: account budgeted has a budget of 30 CPU-minutes",
    );
    // The first holds 20 of the 30 for its whole time limit; the second would need 20 more.
    let first = submitted_id(&submit("20m", "sleep 600"));
    c.wait_running(first);
    let second = submitted_id(&submit("20m", "true"));
    wait_reason(
        &c,
        second,
        "AssocGrpCPUMinutes: account budgeted has a budget of 30 CPU-minutes",
    );
    let queue = ok(&c.wharf(&["queue"]));
    assert!(queue.contains("AssocGrpCPUMinutes"), "{queue}");
    let show = ok(&c.wharf(&["show", &second.to_string()]));
    assert!(show.contains("until it resets at"), "{show}");
    // Submitted without -A: the user's default account, named at submit.
    assert!(show.contains("Account: budgeted"), "{show}");

    // A larger budget lets it start at the next pass.
    ok(&c.wharf(&[
        "admin",
        "account",
        "modify",
        "budgeted",
        "--grp-tres-mins",
        "cpu=100",
    ]));
    let done = c.wait_done(second, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    ok(&c.wharf(&["cancel", &first.to_string()]));
    let modified: Vec<_> = audit(&c)
        .into_iter()
        .filter(|e| {
            e["command"]
                .as_str()
                .unwrap()
                .starts_with("account modify budgeted")
        })
        .collect();
    assert_eq!(
        modified.len(),
        1,
        "refused changes are not audited: {modified:?}"
    );
    assert_eq!(modified[0]["old"]["limits"]["grp_tres_mins"]["cpu"], 30);
    assert_eq!(modified[0]["new"]["limits"]["grp_tres_mins"]["cpu"], 100);
}
