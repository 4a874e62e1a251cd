//! A job that needs what its node cannot give (RDMA devices, locked memory, GPUs) fails in
//! under a second, with the reason; RDMA devices, when there, are passed through.

use std::time::Duration;

use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::harness::*;

fn failed_fast(c: &Cluster, id: u64) -> serde_json::Value {
    let job = c.wait_done(id, Duration::from_secs(10));
    assert_eq!(job["state"], "FAILED", "{job}");
    let took = job["end_time"].as_u64().unwrap() - job["submit_time"].as_u64().unwrap();
    assert!(took < 1000, "took {took} ms to fail: {job}");
    assert!(job["start_time"].is_null(), "{job}");
    job
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
