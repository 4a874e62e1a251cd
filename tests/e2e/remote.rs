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
    // A host of its own (state and cgroup parent): two agents never share them.
    c.agent_with("intruder", &bad_token, "");
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

#[test]
fn a_second_agent_under_the_same_cgroup_parent_is_refused_at_start() {
    let name = "a_second_agent_under_the_same_cgroup_parent_is_refused_at_start";
    if !can_run(name) {
        return;
    }
    let mut c = TcpCluster::controller("wharf-claim-", "");
    let token = c.token();
    let parent = c.cgroup_parent_of("first");
    c.agent_with("first", &token, "");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.nodes().contains("first") {
        assert!(
            Instant::now() < deadline,
            "the first agent never registered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A second agent, with a state directory of its own but the first one's cgroup parent:
    // its jobs' cgroups would be the first one's (a job's is named by its id).
    let d = c.dir.path();
    let config = d.join("agent-second.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]\nstate_dir = \"{}/agent-second\"\nimage_store = \"{}/images\"\n\
             cgroup_parent = \"{parent}\"\n",
            d.display(),
            d.display()
        ),
    )
    .unwrap();
    let mut second = Command::new(wharf_bin())
        .args(["agent", "--config"])
        .arg(&config)
        .args(["--controller", &format!("127.0.0.1:{}", c.port)])
        .args(["--node-name", "second", "--join-token-file"])
        .arg(&token)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second agent under cgroup parent {parent} kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let said = std::io::read_to_string(second.stderr.take().unwrap()).unwrap();
    assert!(!status.success());
    assert!(
        said.contains(&format!("under cgroup parent \"{parent}\""))
            && said.contains("`[agent] cgroup_parent`"),
        "{said}"
    );
    assert!(!c.nodes().contains("second"), "{}", c.nodes());
    // The first one still runs jobs.
    let run = c.wharf(&["run", "--", "/bin/echo", "still here"]);
    assert_eq!(stdout(&run), "still here\n", "{}", stderr(&run));
}
