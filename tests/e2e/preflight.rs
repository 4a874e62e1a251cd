//! A job that needs what its node cannot give (RDMA devices, locked memory, GPUs) fails in
//! the agent's preflight, in well under a second, with the reason; RDMA devices, when there,
//! are passed through.

use std::time::Duration;

use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::harness::*;

/// The job failed in the agent's preflight: FAILED, never started, the preflight itself (from
/// the agent taking the launch order to its refusal, as its log records them) well under a
/// second, and the whole round from submit bounded by a margin only a hang would exceed.
fn failed_fast(c: &Cluster, id: u64) -> serde_json::Value {
    let job = c.wait_done(id, Duration::from_secs(10));
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(job["start_time"].is_null(), "{job}");
    let took = preflight_ms(&c.log(), id);
    assert!(took < 1000.0, "the preflight took {took} ms: {job}");
    let round = job["end_time"].as_u64().unwrap() - job["submit_time"].as_u64().unwrap();
    assert!(round < 10_000, "failed {round} ms after its submit: {job}");
    job
}

/// Milliseconds from the agent's `launching` line for job `id` to its `launch failed` line.
fn preflight_ms(log: &str, id: u64) -> f64 {
    let at = |what: &str| {
        log.lines()
            .filter(|l| l.contains(what))
            .filter(|l| l.split_whitespace().any(|w| w == format!("job={id}")))
            .find_map(|l| seconds_of_day(l.split_whitespace().next()?))
            .unwrap_or_else(|| panic!("no {what:?} line for job {id} in the log:\n{log}"))
    };
    let (from, to) = (at("launching"), at("launch failed"));
    // Across midnight the second time is the next day's.
    let secs = if to >= from {
        to - from
    } else {
        to + 86_400.0 - from
    };
    secs * 1000.0
}

/// `2026-01-02T03:04:05.678901Z` (the log's timestamp) as seconds since midnight.
fn seconds_of_day(stamp: &str) -> Option<f64> {
    let time = stamp.split_once('T')?.1.trim_end_matches('Z');
    let mut parts = time.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

#[test]
fn rdma_job_on_a_node_without_rdma_fails_at_once() {
    if !can_run("rdma_job_on_a_node_without_rdma_fails_at_once") {
        return;
    }
    let dev = scratch("wharf-fakedev-");
    let c = Cluster::start_with(&format!("dev_root = \"{}\"", dev.path().display()));
    let alice = user("wharf-alice");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--rdma", "--wrap", "true"]));
    let job = failed_fast(&c, id);
    assert!(
        job["reason"]
            .as_str()
            .unwrap()
            .contains("needs RDMA but node"),
        "{job}"
    );
}

#[test]
fn rdma_devices_are_passed_through_when_present() {
    if !can_run("rdma_devices_are_passed_through_when_present") {
        return;
    }
    let dev = scratch("wharf-fakedev-");
    let ib = dev.path().join("infiniband");
    std::fs::create_dir_all(&ib).unwrap();
    for (name, major, minor) in [("uverbs0", 231, 192), ("rdma_cm", 10, 58)] {
        mknod(
            &ib.join(name),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(major, minor),
        )
        .unwrap();
    }
    let c = Cluster::start_with(&format!("dev_root = \"{}\"", dev.path().display()));
    let alice = user("wharf-alice");
    let script = "echo $(ls /dev/infiniband); head -c1 /dev/infiniband/uverbs0 2>&1 | grep -o 'No such device or address'";
    let out = c.run_sh(&alice, &["--rdma"], script);
    assert_eq!(
        stdout(&out),
        "rdma_cm uverbs0\nNo such device or address\n",
        "{}",
        stderr(&out)
    );
    // Without --rdma the job gets none.
    let out = c.run_sh(
        &alice,
        &[],
        "ls /dev/infiniband 2>&1 | grep -c 'No such file'",
    );
    assert_eq!(stdout(&out), "1\n");
}

#[test]
fn job_needing_more_memlock_than_the_node_gives_fails_at_once() {
    if !can_run("job_needing_more_memlock_than_the_node_gives_fails_at_once") {
        return;
    }
    // The node gives at most 64M whatever its privileges.
    let c = Cluster::start_with("memlock = \"64M\"");
    let alice = user("wharf-alice");
    let id = submitted_id(&c.wharf_as(
        &alice,
        &["submit", "--memlock", "unlimited", "--wrap", "true"],
    ));
    let job = failed_fast(&c, id);
    let reason = job["reason"].as_str().unwrap();
    assert!(
        reason.contains("needs unlimited of locked memory (memlock)"),
        "{reason}"
    );
    // A need it can meet runs.
    let out = c.wharf_as(&alice, &["run", "--memlock", "1M", "--", "/bin/true"]);
    assert!(out.status.success(), "{}", stderr(&out));
}
