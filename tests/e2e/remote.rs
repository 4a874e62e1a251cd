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

    // A job runs on the remote agent, its output file (named, so kept) where it was run.
    let run = c.wharf(&["run", "-o", "wharf-%j.out", "--", "/bin/echo", "over tcp"]);
    assert_eq!(stdout(&run), "over tcp\n", "{}", stderr(&run));
    assert!(
        d.join("wharf-1.out").exists(),
        "output not in the submit directory"
    );

    // Users may not use the TCP port: it carries no identity. The CLI says so without
    // trying, and the controller refuses a user's request that comes over it anyway.
    for args in [&["queue"][..], &["run", "--", "/bin/true"]] {
        let tcp = Command::new(wharf_bin())
            .args(args)
            .env("WHARF_SOCKET", format!("tcp://127.0.0.1:{}", c.port))
            .output()
            .unwrap();
        assert_eq!(tcp.status.code(), Some(1), "{args:?}");
        // Said at once: not a controller out of reach, to wait for.
        let said = stderr(&tcp);
        assert!(
            said.contains("Unix socket") && !said.contains("retrying"),
            "{said}"
        );
    }
    let mut s = tls_stream(c.port, &c.ca());
    std::io::Write::write_all(
        &mut s,
        b"GET /v1/jobs HTTP/1.1\r\nhost: wharf\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 403") && answer.contains("Unix socket"),
        "{answer}"
    );
}

/// The TCP port speaks TLS alone, with a certificate that only the controller's own
/// authority signs: the node keys, the join token and the jobs' commands and environments
/// (like everything else on the port) never cross the network in the clear, and an agent
/// given another authority never joins. Every byte between an agent and the controller is relayed here
/// and read: on the code that served plain HTTP, the node's key, the join token, the job's
/// environment and its command were all in it, and every route's name.
#[test]
fn agents_and_controller_speak_only_tls_checked_by_the_controllers_authority() {
    if !can_run("agents_and_controller_speak_only_tls_checked_by_the_controllers_authority") {
        return;
    }
    let mut c = TcpCluster::controller("wharf-tls-", "");
    let d = c.dir.path().to_path_buf();
    let ca = std::fs::read_to_string(c.ca()).unwrap();
    assert!(ca.contains("BEGIN CERTIFICATE"), "{ca}");

    // A plain HTTP request gets no HTTP answer.
    let mut plain = std::net::TcpStream::connect(("127.0.0.1", c.port)).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    std::io::Write::write_all(
        &mut plain,
        b"GET /v1/agent/poll HTTP/1.1\r\nhost: wharf\r\n\r\n",
    )
    .unwrap();
    let mut got = Vec::new();
    let _ = std::io::Read::read_to_end(&mut plain, &mut got);
    assert!(
        !got.starts_with(b"HTTP"),
        "{}",
        String::from_utf8_lossy(&got)
    );

    // A probe talks to no controller, and needs no authority.
    let (status, said) = exits_within(
        Command::new(wharf_bin())
            .args([
                "agent",
                "--probe",
                "--controller",
                &format!("127.0.0.1:{}", c.port),
            ])
            .arg("--controller-ca")
            .arg(d.join("nowhere/ca.pem")),
        "a probe",
    );
    assert!(status.success(), "{said}");

    // An agent without the authority does not start, and says what to copy where.
    let missing = d.join("nowhere/ca.pem");
    let (status, said) = exits_within(
        Command::new(wharf_bin())
            .args(["agent", "--controller", &format!("127.0.0.1:{}", c.port)])
            .arg("--join-token-file")
            .arg(c.token())
            .arg("--controller-ca")
            .arg(&missing)
            .arg("--state-dir")
            .arg(d.join("agent-without")),
        "an agent without the authority",
    );
    assert!(!status.success());
    assert!(
        said.contains(&format!("{} is missing", missing.display()))
            && said.contains("copy the controller's ca.pem"),
        "{said}"
    );

    // An agent that trusts another authority (here: a copy of another controller's) never
    // joins, and says why.
    let other = TcpCluster::controller("wharf-tls-other-", "");
    let wrong_ca = d.join("wrong-ca.pem");
    std::fs::copy(other.ca(), &wrong_ca).unwrap();
    drop(other);
    c.agent_with(
        "mistrusting",
        &c.token(),
        &format!("controller_ca = \"{}\"", wrong_ca.display()),
    );

    // The agent that registers reaches the controller through a relay that keeps every byte.
    let relay = Relay::start(c.port);
    c.agent_via("n1", relay.port);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !c.nodes().contains("n1") {
        assert!(Instant::now() < deadline, "the agent never registered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let run = c.wharf(&[
        "run",
        "--env",
        "SECRET_VALUE=env-4b8c1f",
        "--",
        "/bin/sh",
        "-c",
        "echo output-9d2e7a-$SECRET_VALUE",
    ]);
    assert_eq!(
        stdout(&run),
        "output-9d2e7a-env-4b8c1f\n",
        "{}",
        stderr(&run)
    );
    std::thread::sleep(Duration::from_millis(500));
    let log = std::fs::read_to_string(d.join("mistrusting.log")).unwrap();
    assert!(
        log.contains("no TLS with the controller") && log.contains("controller_ca"),
        "{log}"
    );
    assert!(!c.nodes().contains("mistrusting"), "{}", c.nodes());

    let wire = relay.bytes();
    let kept = std::fs::read_to_string(d.join("agent-n1/node-key")).unwrap();
    let key = kept.lines().nth(1).expect("the agent keeps its key");
    let token = std::fs::read_to_string(c.token()).unwrap();
    assert!(wire.len() > 1000, "the relay carried {} bytes", wire.len());
    for secret in [
        key,
        token.trim(),
        "env-4b8c1f",
        "output-9d2e7a",
        "/v1/agent",
    ] {
        assert!(
            !wire.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret:?} crossed the network in the clear"
        );
    }
}

/// A TCP relay on loopback to `port` that keeps a copy of every byte it carries, both ways.
struct Relay {
    port: u16,
    bytes: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Relay {
    fn start(to: u16) -> Relay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let bytes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = bytes.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                for (mut from, mut into) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let kept = kept.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        loop {
                            match std::io::Read::read(&mut from, &mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => {
                                    kept.lock().unwrap().extend_from_slice(&buf[..n]);
                                    if std::io::Write::write_all(&mut into, &buf[..n]).is_err() {
                                        break;
                                    }
                                }
                            }
                        }
                        let _ = into.shutdown(std::net::Shutdown::Write);
                    });
                }
            }
        });
        Relay { port, bytes }
    }

    fn bytes(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }
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
    let (status, said) = exits_within(
        Command::new(wharf_bin())
            .args(["agent", "--config"])
            .arg(&config)
            .args(["--controller", &format!("127.0.0.1:{}", c.port)])
            .args(["--node-name", "second", "--join-token-file"])
            .arg(&token),
        &format!("a second agent under cgroup parent {parent}"),
    );
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

/// Runs `cmd` (an agent that must stop by itself) to its end, killing it and failing with
/// `what` if it is still running after 20 s: its exit status and standard error.
fn exits_within(cmd: &mut Command, what: &str) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} kept running");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status, reader.join().unwrap())
}
