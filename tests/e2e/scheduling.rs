//! The live controller schedules with the core's policy: a short job backfills past a job that
//! waits for the whole node, a long one does not, and each waiting job says why in words.

use std::time::{Duration, Instant};

use crate::harness::*;

#[test]
fn a_short_job_backfills_and_waiting_jobs_say_why() {
    if !can_run("a_short_job_backfills_and_waiting_jobs_say_why") {
        return;
    }
    let c = Cluster::start_with("[scheduler]\npolicy = \"easy\"\n");
    let u = user("whsched-bf");
    if !c.has_cpus("a_short_job_backfills_and_waiting_jobs_say_why", 2) {
        return;
    }
    let cpus = c.node_cpus();
    let submit = |n: u64, time: &str, script: &str| {
        submitted_id(&c.wharf_as(
            &u,
            &[
                "submit",
                "--cpus",
                &n.to_string(),
                "--mem",
                "16M",
                "--time",
                time,
                "--wrap",
                script,
            ],
        ))
    };
    // Every CPU but one is busy for up to 10 minutes.
    let busy = submit(cpus - 1, "10m", "sleep 600");
    c.wait_running(busy);
    let whole = submit(cpus, "10m", "true"); // reserved at the busy job's end
    let long = submit(1, "30m", "true"); // would hold a CPU past that reservation
    let short = submit(1, "1m", "true"); // ends before it: backfills now

    let done = c.wait_done(short, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (w, l) = (c.job(whole), c.job(long));
        let (wr, lr) = (
            w["reason"].as_str().unwrap_or_default().to_string(),
            l["reason"].as_str().unwrap_or_default().to_string(),
        );
        if wr.starts_with("Resources:") && lr.starts_with("Priority:") {
            assert_eq!(w["state"], "PENDING");
            assert_eq!(l["state"], "PENDING");
            assert!(wr.contains("expected to start in about"), "{wr}");
            break;
        }
        assert!(Instant::now() < deadline, "reasons: {wr:?} / {lr:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Another user sees the same words: they come from public fields only.
    let other = user("whsched-bf2");
    let seen: serde_json::Value = serde_json::from_slice(
        &c.wharf_as(&other, &["show", &whole.to_string(), "--json"])
            .stdout,
    )
    .unwrap();
    assert!(
        seen["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Resources:"),
        "{seen}"
    );
    // `wharf queue` shows when the reserved job should start, and when the one behind it
    // is expected to (an estimate, past the reservation).
    let queue = stdout(&c.wharf_as(&u, &["queue"]));
    assert!(queue.contains("Resources, starts in "), "{queue}");
    assert!(queue.contains("Priority, starts in "), "{queue}");
    // `wharf show` prints the expected start and each priority factor.
    let shown = stdout(&c.wharf_as(&u, &["show", &whole.to_string()]));
    assert!(
        shown.contains("Expected start") && shown.contains("+ fair share "),
        "{shown}"
    );
    // `wharf queue --priority` (sprio) lists the waiting jobs, highest priority first.
    let prio = stdout(&c.wharf_as(&u, &["queue", "--priority"]));
    assert!(
        prio.starts_with("JOBID") && prio.contains("FAIRSHARE"),
        "{prio}"
    );
    let at = |id: u64| {
        prio.lines()
            .position(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("job {id} not listed: {prio}"))
    };
    // The whole-node job is larger (a higher JOBSIZE factor): it comes first.
    assert!(at(whole) < at(long), "{prio}");
    assert!(
        !prio.contains(&format!("\n{busy} ")),
        "a running job: {prio}"
    );
    for id in [busy, whole, long] {
        assert!(c.wharf(&["cancel", &id.to_string()]).status.success());
    }
}

#[test]
fn partitions_from_the_config_are_chosen_with_dash_p_and_checked_at_submit() {
    if !can_run("partitions_from_the_config_are_chosen_with_dash_p_and_checked_at_submit") {
        return;
    }
    let c = Cluster::start_with(
        "[[scheduler.partition]]\nname = \"batch\"\ndefault = true\n\
         [[scheduler.partition]]\nname = \"quick\"\nmax_time = \"10m\"\n",
    );
    let u = user("whsched-part");
    let out = c.wharf_as(&u, &["submit", "-p", "nope", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unknown partition \"nope\"; this cluster has: batch, quick"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(&u, &["submit", "-p", "quick", "-t", "1h", "--wrap", "true"]);
    assert!(
        stderr(&out).contains("over partition quick's maximum of"),
        "{}",
        stderr(&out)
    );
    let id =
        submitted_id(&c.wharf_as(&u, &["submit", "-p", "quick", "-t", "5m", "--wrap", "true"]));
    let done = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    assert_eq!(done["spec"]["partition"], "quick", "{done}");
    // `wharf nodes --partitions` (sinfo -s): one line each, the default starred.
    let parts = stdout(&c.wharf_as(&u, &["nodes", "--partitions"]));
    let lines: Vec<&str> = parts.lines().collect();
    assert!(
        lines[0].starts_with("PARTITION  AVAIL  TIMELIMIT"),
        "{parts}"
    );
    assert!(
        lines[1].starts_with("batch*  ") && lines[1].contains(" infinite "),
        "{parts}"
    );
    assert!(
        lines[2].starts_with("quick   ") && lines[2].contains(" 00:10:00 "),
        "{parts}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&c.wharf_as(&u, &["nodes", "-p", "--json"]).stdout).unwrap();
    assert_eq!(json["partitions"][1]["max_time_s"], 600, "{json}");
    assert_eq!(json["partitions"][0]["nodes"]["idle"], 1, "{json}");
}

#[test]
fn a_partitions_default_time_and_memory_per_cpu_apply_and_its_maximum_is_refused() {
    let name = "a_partitions_default_time_and_memory_per_cpu_apply_and_its_maximum_is_refused";
    if !can_run(name) {
        return;
    }
    let c = Cluster::start_with(
        "[[scheduler.partition]]\nname = \"batch\"\ndefault = true\n\
         [[scheduler.partition]]\nname = \"quick\"\nmax_time = \"10m\"\n\
         def_mem_per_cpu = \"300M\"\nmax_mem_per_cpu = \"1G\"\n",
    );
    let u = user("whsched-pdef");
    // No --time: the site's default (an hour) is over quick's maximum, which it gets.
    let id = submitted_id(&c.wharf_as(&u, &["submit", "-p", "quick", "-H", "--wrap", "true"]));
    let shown: serde_json::Value =
        serde_json::from_slice(&c.wharf_as(&u, &["show", &id.to_string(), "--json"]).stdout)
            .unwrap();
    assert_eq!(shown["time_limit"], 600, "{shown}");
    assert_eq!(
        shown["spec"]["resources"]["memory"],
        300u64 << 20,
        "{shown}"
    );
    let out = c.wharf_as(
        &u,
        &[
            "submit",
            "-p",
            "quick",
            "--mem-per-cpu",
            "2G",
            "--wrap",
            "true",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("over partition quick's MaxMemPerCPU of 1G"),
        "{}",
        stderr(&out)
    );
    let out = c.wharf_as(
        &u,
        &[
            "submit",
            "--mem",
            "1G",
            "--mem-per-cpu",
            "1G",
            "--wrap",
            "true",
        ],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--mem-per-cpu"), "{}", stderr(&out));
    // The partition's memory per CPU, default/max, in its admin table.
    let table = stdout(&c.wharf(&["admin", "partition", "show", "quick"]));
    assert!(
        table.contains("MEM/CPU") && table.contains("300M/1G"),
        "{table}"
    );
    assert!(c.wharf(&["cancel", &id.to_string()]).status.success());
}

#[test]
fn an_accounts_cpu_limit_holds_the_second_job_while_another_users_job_runs() {
    let name = "an_accounts_cpu_limit_holds_the_second_job_while_another_users_job_runs";
    if !can_run(name) {
        return;
    }
    let c = Cluster::start_with(
        "[[scheduler.account]]\nname = \"lab\"\ngrp_tres = { cpu = 1 }\n\
         [[scheduler.account]]\nname = \"other\"\n\
         [[scheduler.user]]\nname = \"whlim-ann\"\naccount = \"lab\"\n\
         [[scheduler.user]]\nname = \"whlim-bob\"\naccount = \"other\"\n",
    );
    let (ann, bob) = (user("whlim-ann"), user("whlim-bob"));
    if !c.has_cpus(name, 2) {
        return;
    }
    let submit = |u: &User, cpus: &str, script: &str| {
        c.wharf_as(
            u,
            &[
                "submit", "--cpus", cpus, "--mem", "16M", "-t", "10m", "--wrap", script,
            ],
        )
    };
    // Over the account's limit on its own: refused at submit with the reason.
    let out = submit(&ann, "2", "true");
    assert!(!out.status.success());
    assert!(
        stderr(&out)
            .contains("this job could never start: AssocGrpCpuLimit: account lab allows 1 CPU"),
        "{}",
        stderr(&out)
    );
    let first = submitted_id(&submit(&ann, "1", "sleep 600"));
    c.wait_running(first);
    let second = submitted_id(&submit(&ann, "1", "true"));
    // A CPU is free, and another user's job takes it while ann's second job waits.
    let other = submitted_id(&submit(&bob, "1", "true"));
    let done = c.wait_done(other, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    // Passes after bob's job ended (a CPU is free again) still hold ann's job by the limit.
    std::thread::sleep(Duration::from_secs(2));
    let want = "AssocGrpCpuLimit: account lab allows 1 CPU for all its jobs together \
                (grp_tres cpu); 1 CPU is in use and it asks for 1 CPU";
    let job = c.job(second);
    assert_eq!(job["state"], "PENDING", "{job}");
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with(want), "{reason}");
    // Bob sees the same sentence (it names only the account and numbers).
    let out = c.wharf_as(&bob, &["show", &second.to_string(), "--json"]);
    let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        seen["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with(want),
        "{seen}"
    );
    // When the first job ends, the second starts.
    assert!(c.wharf(&["cancel", &first.to_string()]).status.success());
    let done = c.wait_done(second, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
}

#[test]
fn wharf_share_shows_the_fair_share_tree_with_each_users_factor() {
    if !can_run("wharf_share_shows_the_fair_share_tree_with_each_users_factor") {
        return;
    }
    let c = Cluster::start();
    let (used, idle) = (user("whshare-used"), user("whshare-idle"));
    // One user runs a job (its usage is charged when it ends); the other only waits.
    let ran = submitted_id(&c.wharf_as(&used, &["submit", "--wrap", "sleep 1"]));
    let done = c.wait_done(ran, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let held = submitted_id(&c.wharf_as(&idle, &["submit", "-H", "--wrap", "true"]));
    let share = |who: &User, args: &[&str]| -> serde_json::Value {
        let mut all = vec!["share", "--json"];
        all.extend(args);
        let out = c.wharf_as(who, &all);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let line = |tree: &serde_json::Value, user: &str| -> Option<serde_json::Value> {
        tree["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["user"] == user)
            .cloned()
    };
    // A user sees its own line and its account, nobody else's.
    let mine = share(&used, &[]);
    let me = line(&mine, "whshare-used").expect("the caller's line");
    assert!(me["usage"].as_f64().unwrap() > 0.0, "{me}");
    assert!(me["factor"].as_f64().is_some(), "{me}");
    let accounts: Vec<&str> = mine["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r.get("user").is_none())
        .map(|r| r["account"].as_str().unwrap())
        .collect();
    assert_eq!(accounts, vec!["whshare-used"], "{mine}");
    let out = c.wharf_as(&used, &["share", "--all"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("only admins"), "{}", stderr(&out));
    // An admin sees everyone's with --all: the user who used nothing ranks first.
    let out = c.wharf(&["share", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (me, other) = (
        line(&all, "whshare-used").unwrap(),
        line(&all, "whshare-idle").unwrap(),
    );
    assert!(
        other["factor"].as_f64().unwrap() > me["factor"].as_f64().unwrap(),
        "{all}"
    );
    assert_eq!(other["usage"], 0.0);
    let table = stdout(&c.wharf_as(&used, &["share"]));
    assert!(
        table.contains("FAIRSHARE") && table.contains("whshare-used"),
        "{table}"
    );
    assert!(table.contains("halving every 7 days"), "{table}");
    assert!(c.wharf(&["cancel", &held.to_string()]).status.success());
}
