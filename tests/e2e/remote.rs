//! A controller and an agent as separate processes over TCP, joined by the token; what
//! happens with a wrong token, user requests over TCP and an unreachable controller.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

#[test]
fn agent_joins_over_tcp_only_with_the_token() {
    if !can_run("agent_joins_over_tcp_only_with_the_token") {
        return;
    }
    let mut c = TcpCluster::controller("wharf-remote-", "");
    let d = c.dir.path().to_path_buf();
    let token = c.token();
    let bad_token = d.join("bad-token");
    std::fs::write(&bad_token, "not-the-token\n").unwrap();
    c.agent("intruder", &bad_token);
    c.agent("good", &token);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.nodes().contains("good") {
        assert!(Instant::now() < deadline, "agent never registered");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let nodes = c.nodes();
    assert!(
        !nodes.contains("intruder"),
        "an agent joined without the token:\n{nodes}"
    );
    let intruder_log = std::fs::read_to_string(d.join("intruder.log")).unwrap();
    assert!(intruder_log.contains("join token"), "{intruder_log}");

    // A job runs on the remote agent.
    let run = c.wharf(&["run", "--", "/bin/echo", "over tcp"]);
    assert_eq!(stdout(&run), "over tcp\n", "{}", stderr(&run));
    assert!(
        d.join("wharf-1.out").exists(),
        "output not in the submit directory"
    );

    // Users may not use the TCP port: it carries no identity.
    let tcp = Command::new(wharf_bin())
        .arg("queue")
        .env("WHARF_SOCKET", format!("tcp://127.0.0.1:{}", c.port))
        .output()
        .unwrap();
    assert_eq!(tcp.status.code(), Some(1));
    assert!(stderr(&tcp).contains("Unix socket"), "{}", stderr(&tcp));
}

#[test]
fn unreachable_controller_is_reported_clearly() {
    let out = Command::new(wharf_bin())
        .args(["queue"])
        .env("WHARF_SOCKET", "/nonexistent/wharf.sock")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("cannot reach the Wharf controller at /nonexistent/wharf.sock"),
        "{err}"
    );
    assert!(err.contains("WHARF_SOCKET"), "{err}");
}
