//! A controller and an agent as separate processes over TCP, joined by the token; what
//! happens with a wrong token, user requests over TCP and an unreachable controller.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn agent_joins_over_tcp_only_with_the_token() {
    if !can_run("agent_joins_over_tcp_only_with_the_token") {
        return;
    }
    let dir = scratch("wharf-remote-");
    let d = dir.path();
    let port = free_port();
    let socket = d.join("wharf.sock");
    let config = d.join("wharf.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nstate_dir = \"{0}/ctl\"\nsocket = \"{1}\"\nlisten = \"127.0.0.1:{port}\"\n[agent]\nstate_dir = \"{0}/agent\"\nimage_store = \"{0}/images\"\n",
            d.display(),
            socket.display()
        ),
    )
    .unwrap();
    let log = |name: &str| std::fs::File::create(d.join(name)).unwrap();
    let _ctl = Proc(
        Command::new(wharf_bin())
            .args(["controller", "--config"])
            .arg(&config)
            .stderr(log("ctl.log"))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let token = d.join("ctl/join-token");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !token.exists() || !socket.exists() {
        assert!(Instant::now() < deadline, "controller did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let agent = |name: &str, token: &std::path::Path| {
        Proc(
            Command::new(wharf_bin())
                .args(["agent", "--config"])
                .arg(&config)
                .args([
                    "--controller",
                    &format!("127.0.0.1:{port}"),
                    "--node-name",
                    name,
                    "--join-token-file",
                ])
                .arg(token)
                .stderr(log(&format!("{name}.log")))
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        )
    };
    let bad_token = d.join("bad-token");
    std::fs::write(&bad_token, "not-the-token\n").unwrap();
    let _intruder = agent("intruder", &bad_token);
    let _good = agent("good", &token);
    // Run from the test's directory: a job's output file goes to the submit directory.
    let wharf = |args: &[&str], sock: &str| {
        Command::new(wharf_bin())
            .args(args)
            .env("WHARF_SOCKET", sock)
            .current_dir(d)
            .output()
            .unwrap()
    };
    let sock = socket.to_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !stdout(&wharf(&["nodes"], sock)).contains("good") {
        assert!(Instant::now() < deadline, "agent never registered");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let nodes = stdout(&wharf(&["nodes"], sock));
    assert!(
        !nodes.contains("intruder"),
        "an agent joined without the token:\n{nodes}"
    );
    let intruder_log = std::fs::read_to_string(d.join("intruder.log")).unwrap();
    assert!(intruder_log.contains("join token"), "{intruder_log}");

    // A job runs on the remote agent.
    let run = wharf(&["run", "--", "/bin/echo", "over tcp"], sock);
    assert_eq!(stdout(&run), "over tcp\n", "{}", stderr(&run));
    assert!(
        d.join("wharf-1.out").exists(),
        "output not in the submit directory"
    );

    // Users may not use the TCP port: it carries no identity.
    let tcp = wharf(&["queue"], &format!("tcp://127.0.0.1:{port}"));
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
