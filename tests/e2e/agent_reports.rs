//! What an agent reports about its jobs stays within what the controller takes, whatever the
//! jobs did: a user cannot cut a node off from the controller (and keep kill orders from it)
//! with jobs whose launch errors are huge.

use std::process::{Child, Stdio};
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
            setpriv(&eve)
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
    c.cancel_as(&bob, long);
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

/// Sends `head` (and `body`) to `c`'s TCP port; the status line of the answer, or why there
/// was none within `limit`.
fn exchange(c: &TcpCluster, head: &str, body: &[u8], limit: Duration) -> String {
    answer(c, head, body, limit, false)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Sends `head` (and `body`) to `c`'s TCP port, over TLS as agents do; the answer, its head
/// alone unless `whole` (then all until the connection closes), or why there was none
/// within `limit`.
fn answer(c: &TcpCluster, head: &str, body: &[u8], limit: Duration, whole: bool) -> String {
    use std::io::{Read, Write};
    let mut s = tls_stream(c.port, &c.ca());
    s.sock.set_read_timeout(Some(limit)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    if let Err(e) = s.write_all(body) {
        return format!("sending the body: {e}");
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while whole || !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf) {
            // A close without TLS's close_notify ends the answer too.
            Ok(0) => break,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) => return format!("no answer: {e}"),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// A POST of `body` to `path` with `auth` as the bearer token (none if empty): the answer.
fn post(c: &TcpCluster, path: &str, auth: &str, body: &str) -> String {
    let head = post_head(path, auth, body.len());
    answer(c, &head, body.as_bytes(), Duration::from_secs(20), true)
}

/// The head of a `POST` to `path` of `len` bytes of JSON, with `auth` as its bearer
/// credential (none when empty).
fn post_head(path: &str, auth: &str, len: usize) -> String {
    let auth = if auth.is_empty() {
        String::new()
    } else {
        format!("authorization: Bearer {auth}\r\n")
    };
    format!(
        "POST {path} HTTP/1.1\r\nhost: wharf\r\ncontent-type: application/json\r\n{auth}content-length: {len}\r\nconnection: close\r\n\r\n"
    )
}

/// The agents' routes have their own body limit (a poll reports every job of its node) and
/// check the node's key before reading a body. On the old code an agent's 2 MB report was
/// refused by the users' 1 MiB limit, and a request without a key was answered only
/// after its body had been read.
#[test]
fn agents_routes_check_the_token_first_and_take_large_reports() {
    if !can_run("agents_routes_check_the_token_first_and_take_large_reports") {
        return;
    }
    let c = TcpCluster::start("");
    // Agents' routes take a node's own key: the one n1's agent got when it joined.
    let kept = std::fs::read_to_string(c.dir.path().join("agent/node-key")).unwrap();
    let token = kept.lines().nth(1).expect("the agent keeps its key");
    // A valid report padded with 2 MB of JSON whitespace.
    let mut body = br#"{"node":"n1","jobs":[],"wait_ms":0,"images":[]}"#.to_vec();
    body.resize(body.len() + 2_000_000, b' ');
    let head = |auth: &str, len: usize| post_head("/v1/agent/poll", auth, len);
    let status = exchange(&c, &head(token, body.len()), &body, Duration::from_secs(20));
    assert!(
        status.contains(" 200 "),
        "a 2 MB report with the token: {status}"
    );
    // Without a key: refused on the head alone, the announced body never sent.
    let t = Instant::now();
    let status = exchange(&c, &head("", body.len()), &[], Duration::from_secs(2));
    assert!(
        status.contains(" 401 "),
        "no key, 2 MB announced and not sent: {status} after {:?}",
        t.elapsed()
    );
    assert!(c.nodes().contains("UP"), "{}", c.nodes());
}

/// Each node holds a key of its own, kept 0600 in its agent's state; the join token only
/// joins, once per name; a key speaks for its own node only; and once an admin forgets a key
/// its agent joins again by itself and the node goes on. On the old code the join token was
/// every agent's credential, so any node (or whoever read the token on one) could poll in
/// another node's name and take its launch orders.
#[test]
fn a_nodes_key_is_its_own_and_a_forgotten_one_makes_its_agent_join_again() {
    use std::os::unix::fs::PermissionsExt;
    if !can_run("a_nodes_key_is_its_own_and_a_forgotten_one_makes_its_agent_join_again") {
        return;
    }
    let c = TcpCluster::start("");
    let join_token = std::fs::read_to_string(c.dir.path().join("ctl/join-token")).unwrap();
    let join_token = join_token.trim();
    let file = c.dir.path().join("agent/node-key");
    let kept = std::fs::read_to_string(&file).unwrap();
    let mut lines = kept.lines();
    assert_eq!(lines.next(), Some("n1"), "{kept}");
    let n1 = lines.next().unwrap().to_string();
    assert!(n1.starts_with("wnk_") && n1 != join_token, "{kept}");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let poll = |node: &str| format!(r#"{{"node":"{node}","jobs":[],"wait_ms":0,"images":[]}}"#);
    let status = |answer: &str| answer.lines().next().unwrap_or("").to_string();
    // The join token polls as nobody, and cannot take n1's name with another key.
    let answer = post(&c, "/v1/agent/poll", join_token, &poll("n1"));
    assert!(status(&answer).contains(" 403 "), "{answer}");
    let other = format!("wnk_{}", "07".repeat(32));
    let join = |node: &str| format!(r#"{{"node":"{node}","key":"{other}"}}"#);
    let answer = post(&c, "/v1/agent/join", join_token, &join("n1"));
    assert!(status(&answer).contains(" 409 "), "{answer}");
    assert!(answer.contains("--forget-key n1"), "{answer}");
    // A new node's key is its own: it does not speak for n1.
    let answer = post(&c, "/v1/agent/join", join_token, &join("n7"));
    assert!(status(&answer).contains(" 200 "), "{answer}");
    let answer = post(&c, "/v1/agent/poll", &other, &poll("n1"));
    assert!(status(&answer).contains(" 403 "), "{answer}");
    assert!(answer.contains("speaks for node"), "{answer}");
    // An admin sees both names, and that n7 never registered with its key.
    let out = c.wharf(&["nodes", "--keys"]);
    let text = stdout(&out);
    let listed: Vec<Vec<&str>> = text
        .lines()
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            vec![cells[0], cells[cells.len() - 1]]
        })
        .collect();
    assert_eq!(listed.len(), 2, "{text}");
    assert!(listed[0][0] == "n1" && listed[0][1] != "never", "{text}");
    assert_eq!(listed[1], ["n7", "never"], "{text}");
    // n1's own key is taken.
    let answer = post(&c, "/v1/agent/poll", &n1, &poll("n1"));
    assert!(status(&answer).contains(" 200 "), "{answer}");
    // An admin forgets n1's key: the old key is refused, and the agent joins again by itself.
    let out = c.wharf(&["nodes", "--forget-key", "n1"]);
    assert!(stdout(&out).contains("key forgotten"), "{}", stderr(&out));
    let answer = post(&c, "/v1/agent/poll", &n1, &poll("n1"));
    assert!(status(&answer).contains(" 401 "), "{answer}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = std::fs::read_to_string(&file).unwrap_or_default();
        if now
            .lines()
            .nth(1)
            .is_some_and(|k| k.starts_with("wnk_") && k != n1)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent never joined again: {now}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let run = c.wharf(&["run", "--", "/bin/echo", "after a new key"]);
    assert_eq!(stdout(&run), "after a new key\n", "{}", stderr(&run));
}
