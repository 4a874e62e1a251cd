//! Waiting on a job: `GET /v1/jobs/{id}/wait` is answered by the change, not by a timer.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::*;

/// `GET path` over the controller's socket as root; the status line and the body.
fn get(socket: &Path, path: &str) -> (String, String) {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: wharf\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

#[test]
fn a_wait_is_answered_by_the_change_it_waits_for() {
    if !can_run("a_wait_is_answered_by_the_change_it_waits_for") {
        return;
    }
    let c = Cluster::start();
    let id = submitted_id(&c.wharf(&["submit", "--hold", "--wrap", "true"]));
    // Past the states waited out: answered at once.
    let (status, body) = get(
        &c.socket,
        &format!("/v1/jobs/{id}/wait?state=RUNNING&wait_ms=4000"),
    );
    assert!(status.contains("200"), "{status} {body}");
    assert!(body.contains("\"PENDING\""), "{body}");
    // Held, the job stays pending: the wait ends with the cancel, long before its end.
    let waiter = std::thread::spawn({
        let path = format!("/v1/jobs/{id}/wait?state=PENDING,STARTING&wait_ms=4000");
        let socket = c.socket.clone();
        move || {
            let t0 = Instant::now();
            let answer = get(&socket, &path);
            (answer, t0.elapsed())
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    let out = c.wharf(&["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ((status, body), waited) = waiter.join().unwrap();
    assert!(
        status.contains("200") && body.contains("\"CANCELLED\""),
        "{status} {body}"
    );
    assert!(
        waited < Duration::from_millis(3500) && t0.elapsed() < Duration::from_secs(3),
        "answered after {waited:?}, not by the cancel"
    );
    // A state that does not exist is refused, naming it.
    let (status, body) = get(&c.socket, &format!("/v1/jobs/{id}/wait?state=DONE"));
    assert!(
        status.contains("400") && body.contains("DONE"),
        "{status} {body}"
    );
}
