//! What an agent reports about its jobs stays within what the controller takes, whatever the
//! jobs did: a user cannot cut a node off from the controller (and keep kill orders from it)
//! with jobs whose launch errors are huge.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

/// Two jobs whose argv[0] is 131,000 control characters: the launch error quotes the program,
/// and JSON writes each of those characters as six bytes, so two such reasons carried whole in
/// every poll are over the controller's 1 MiB request limit. On the old code the poll was
/// refused, the agent registered again and again (which kept the node UP) and no order reached
/// the node: another user's job never started.
#[test]
fn huge_launch_errors_do_not_cut_the_node_off() {
    if !can_run("huge_launch_errors_do_not_cut_the_node_off") {
        return;
    }
    let c = Cluster::start();
    let eve = user("whfc-eve");
    let bob = user("whfc-bob");
    let home = c.home(&eve);
    // A job file cannot hold control characters: `wharf run` takes the word as it is.
    let prog = "\u{1}".repeat(131_000);
    let runs: Vec<Child> = (0..2)
        .map(|_| {
            Command::new("setpriv")
                .args([
                    format!("--reuid={}", eve.uid),
                    format!("--regid={}", eve.gid),
                    "--init-groups".into(),
                    "--".into(),
                ])
                .arg(wharf_bin())
                .args(["run", "-c", "1", "-J", "long-argv0", "--quiet", "--"])
                .arg(&prog)
                .env("WHARF_SOCKET", &c.socket)
                .current_dir(&home)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let t = Instant::now();
    for mut run in runs {
        while run.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = run.kill();
        let out = run.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        eprintln!("wharf run: {}", said.chars().take(300).collect::<String>());
    }
    // The cluster is new: eve's jobs are the first two.
    let failed = [1u64, 2];
    for id in failed {
        let done = c.wait_done(id, Duration::from_secs(20));
        assert_eq!(done["owner"]["uid"], eve.uid, "{done}");
        assert_eq!(done["state"], "FAILED", "{done}");
        let reason = done["reason"].as_str().unwrap();
        assert!(
            reason.len() <= 4096 && reason.contains("more bytes]"),
            "job {id}: the reason is {} bytes long: {:?}",
            reason.len(),
            reason.chars().take(200).collect::<String>()
        );
    }

    // The node still takes orders: another user's job starts, and cancelling it reaches it.
    let long = submitted_id(&c.wharf_as(&bob, &["submit", "--wrap", "sleep 300"]));
    let t = Instant::now();
    while c.job(long)["state"] != "RUNNING" {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "another user's job never ran after two huge launch errors: {}\nnodes: {}\nlog tail: {}",
            c.job(long),
            stdout(&c.wharf(&["nodes"])),
            tail(&c.log())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(c
        .wharf_as(&bob, &["cancel", &long.to_string()])
        .status
        .success());
    let done = c.wait_done(long, Duration::from_secs(30));
    assert_eq!(done["state"], "CANCELLED", "{done}");
    let quick = submitted_id(&c.wharf_as(&bob, &["submit", "--wrap", "true"]));
    let done = c.wait_done(quick, Duration::from_secs(30));
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let nodes = stdout(&c.wharf(&["nodes"]));
    assert!(nodes.contains("UP"), "{nodes}");
    let log = c.log();
    assert!(
        !log.contains("poll failed") && !log.contains("refused this node's report"),
        "the agent's reports were refused: {}",
        tail(&log)
    );
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(15)..]
        .iter()
        .map(|l| l.chars().take(300).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}
