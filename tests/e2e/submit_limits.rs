//! Requests that can never run, or that are too large to keep, are refused at submit with the
//! limit they break; nothing is stored.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::harness::*;

/// POSTs `body` to `/v1/jobs` over the socket as the test (root); returns (status, body).
fn post_job(socket: &Path, body: &[u8]) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: wharf\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // The controller may answer and close before it has read a refused body.
    let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body));
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    (status, text)
}

fn job_json(extra: &str) -> String {
    format!(r#"{{"job": {{"command": ["/bin/true"]{extra}}}, "cwd": "/tmp"}}"#)
}

fn stored_jobs(c: &Cluster) -> usize {
    let out = c.wharf(&["queue", "--all", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["jobs"].as_array().unwrap().len()
}

#[test]
fn absurd_and_oversized_requests_are_refused_with_the_limit() {
    if !can_run("absurd_and_oversized_requests_are_refused_with_the_limit") {
        return;
    }
    let c = Cluster::start_with("[limits]\nmax_pending_per_user = 3\n");
    let u = user("whctl-limits");
    let node_cpus = c.node_cpus().to_string();

    // 2^64-1 bytes of memory, from a job file.
    let home = c.home(&u);
    std::fs::write(
        home.join("huge.toml"),
        "command = [\"/bin/true\"]\nmemory = 18446744073709551615\n",
    )
    .unwrap();
    let out = c.wharf_as(&u, &["submit", "huge.toml"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("no node of this cluster can ever run this job")
            && err.contains("memory (the largest node has"),
        "{err}"
    );
    // 1000 GPUs.
    let out = c.wharf_as(&u, &["submit", "--gpus", "1000", "--wrap", "true"]);
    assert!(
        stderr(&out).contains("1000 GPUs (the largest node has 0)"),
        "{}",
        stderr(&out)
    );
    let (status, text) = post_job(&c.socket, job_json(r#", "cpus": 100000"#).as_bytes());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("100000 CPUs (the largest node has"), "{text}");

    // Sizes: an environment over the cap, a body over the request cap.
    let env = format!(r#", "env": {{"BIG": "{}"}}"#, "x".repeat(100 << 10));
    let (status, text) = post_job(&c.socket, job_json(&env).as_bytes());
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("`env` is 102405 bytes; the limit is 65536"),
        "{text}"
    );
    let env = format!(r#", "env": {{"BIG": "{}"}}"#, "x".repeat(1_900_000));
    let (status, text) = post_job(&c.socket, job_json(&env).as_bytes());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("request body is over"), "{text}");
    let cmd = format!(
        r#"{{"job": {{"command": ["/bin/echo", "{}"]}}, "cwd": "/tmp"}}"#,
        "y".repeat(200 << 10)
    );
    let (status, text) = post_job(&c.socket, cmd.as_bytes());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("`command` is"), "{text}");

    // Unknown fields are refused, at the top level as in the job.
    let (status, text) = post_job(
        &c.socket,
        br#"{"job": {"command": ["/bin/true"]}, "cwd": "/tmp", "priority": 1000}"#,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("unknown field `priority`"), "{text}");
    assert_eq!(stored_jobs(&c), 0, "a refused request was stored");

    // Pending jobs per user: one runs on all the CPUs, three wait, the fifth is refused.
    let submit = || {
        c.wharf_as(
            &u,
            &[
                "submit", "--cpus", &node_cpus, "--mem", "16M", "--wrap", "sleep 60",
            ],
        )
    };
    let first = submitted_id(&submit());
    c.wait_running(first);
    for _ in 0..3 {
        submitted_id(&submit());
    }
    let out = submit();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("you have 3 pending jobs")
            && stderr(&out).contains("max_pending_per_user"),
        "{}",
        stderr(&out)
    );
    // Another user is not held back by this one's queue.
    let other = user("whctl-limits2");
    submitted_id(&c.wharf_as(&other, &["submit", "--cpus", &node_cpus, "--wrap", "true"]));
    assert_eq!(stored_jobs(&c), 5);
    let ids: Vec<String> = (first..first + 5).map(|i| i.to_string()).collect();
    let mut args = vec!["cancel"];
    args.extend(ids.iter().map(String::as_str));
    c.wharf(&args);
}
