//! The gang's preflight barrier across separate hosts (`netns.rs`): every node runs the
//! preflight before any rank starts, and a gang with one node that fails it ends (a job
//! fault) or goes back to the queue with the node drained (a node fault) as a whole, naming
//! the node and the reason, with no rank having run its command anywhere.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use crate::harness::*;
use crate::netns::MultiHost;

/// A directory every job may write its marks in: bound into the jobs that ask (the agents
/// allow it with [`allow_marks`]), since a job on the host image sees the host read-only.
fn marks_dir() -> tempfile::TempDir {
    let marks = scratch("wharf-marks-");
    std::fs::set_permissions(marks.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    marks
}

/// The agent config key that lets jobs bind `marks`.
fn allow_marks(marks: &Path) -> String {
    format!("allowed_mounts = [\"{}\"]", marks.display())
}

/// The marks the ranks' commands left.
fn marks(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A 3-node gang that leaves a mark per rank, with `more` submit options.
fn submit_marking(bed: &MultiHost, marks: &Path, more: &[&str]) -> u64 {
    let script = format!("touch {}/ran-$RANK", marks.display());
    let bind = format!("{0}:{0}", marks.display());
    let args = [
        &["--nodes", "3", "--cpus", "1", "--mount", &bind][..],
        more,
        &["--wrap", &script],
    ]
    .concat();
    bed.submit(&args)
}

#[test]
fn a_gang_with_a_node_that_cannot_give_its_memlock_fails_whole_with_no_rank_run() {
    let test = "a_gang_with_a_node_that_cannot_give_its_memlock_fails_whole_with_no_rank_run";
    // node2 gives at most 1 MiB of locked memory; the others what their agents can (the
    // agents inherit this process's limits and capabilities): the job asks for 2 MiB.
    let ceiling = wharf_runtime::memlock_ceiling();
    if ceiling < 2 << 20 {
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{test}: this process can give only {ceiling} bytes of locked memory"
        );
        eprintln!("SKIPPED {test}: agents here can give only {ceiling} bytes of locked memory");
        return;
    }
    let scratch_marks = marks_dir();
    let dir = scratch_marks.path();
    let agent = |i: usize| {
        let memlock = if i == 1 { "memlock = \"1M\"\n" } else { "" };
        format!("{memlock}{}", allow_marks(dir))
    };
    let Some(bed) = MultiHost::start_with_agents(test, 3, "", &agent) else {
        return;
    };
    // The barrier lets a gang that can run, run: every rank leaves its mark.
    let ok = submit_marking(&bed, dir, &["--memlock", "1M"]);
    let job = bed.wait_done(ok, Duration::from_secs(120));
    assert_eq!(
        job["state"],
        "COMPLETED",
        "{job}\n{}\n{}",
        bed.output(ok),
        bed.logs()
    );
    assert_eq!(marks(dir), ["ran-0", "ran-1", "ran-2"]);
    for m in marks(dir) {
        std::fs::remove_file(dir.join(m)).unwrap();
    }

    let id = submit_marking(&bed, dir, &["--memlock", "2M"]);
    let job = bed.wait_done(id, Duration::from_secs(120));
    assert_eq!(job["state"], "FAILED", "{job}\n{}", bed.logs());
    assert!(job["start_time"].is_null(), "{job}");
    let reason = job["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("rank 1 on node node2: ")
            && reason.contains("needs 2M of locked memory (memlock) but node node2"),
        "{reason}"
    );
    assert!(marks(dir).is_empty(), "ranks ran: {:?}", marks(dir));
    // No node was told to start its rank: the failed preflight came before any release.
    for node in ["node1", "node2", "node3"] {
        let log = std::fs::read_to_string(bed.dir.path().join(format!("{node}.log"))).unwrap();
        let released = log.lines().any(|l| {
            l.contains("launching") && l.contains(&format!("job={id} ")) && l.contains("hold=false")
        });
        assert!(!released, "{node} launched job {id}:\n{}", bed.logs());
    }
    let show = stdout(&bed.wharf(&["show", &id.to_string()]));
    assert!(show.contains("node node2"), "{show}");
    // Nothing is left running or waiting on the nodes.
    for i in 0..3 {
        assert!(
            bed.job_pids(i).is_empty(),
            "host {i} still runs job processes"
        );
    }
}

#[test]
fn a_gang_with_a_node_missing_its_rdma_devices_is_requeued_and_says_why() {
    let test = "a_gang_with_a_node_missing_its_rdma_devices_is_requeued_and_says_why";
    // node1 and node3 have (fake) RDMA devices; node2 claims RDMA and has none.
    let devs: Vec<tempfile::TempDir> = (0..3).map(|_| scratch("wharf-fakedev-")).collect();
    for (i, dev) in devs.iter().enumerate() {
        if i == 1 {
            continue;
        }
        let ib = dev.path().join("infiniband");
        std::fs::create_dir_all(&ib).unwrap();
        mknod(
            &ib.join("uverbs0"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(231, 192),
        )
        .unwrap();
    }
    let roots: Vec<String> = devs
        .iter()
        .map(|d| d.path().display().to_string())
        .collect();
    let scratch_marks = marks_dir();
    let dir = scratch_marks.path();
    let agent = |i: usize| {
        let features = if i == 1 {
            "features = [\"rdma\"]\n"
        } else {
            ""
        };
        format!(
            "{features}dev_root = \"{}\"\n{}",
            roots[i],
            allow_marks(dir)
        )
    };
    let Some(bed) = MultiHost::start_with_agents(test, 3, "", &agent) else {
        return;
    };
    let id = submit_marking(&bed, dir, &["--rdma"]);
    // Back in the queue, once: two nodes are left for three ranks, so it waits, saying why.
    let job = bed.wait_job(id, "requeued", Duration::from_secs(120), |j| {
        j["state"] == "PENDING"
            && j["restarts"] == 1
            && j["reason"]
                .as_str()
                .is_some_and(|r| r.contains("requeued after node node2 failed (node fault: rdma)"))
    });
    assert!(job["start_time"].is_null(), "{job}");
    let states = bed.node_states();
    assert_eq!(states["node2"], "DRAIN", "{states:?}");
    let show = stdout(&bed.wharf(&["show", &id.to_string()]));
    assert!(
        show.contains("requeued after node node2 failed (node fault: rdma): the job needs RDMA but node node2 has no RDMA devices"),
        "{show}"
    );
    assert!(marks(dir).is_empty(), "ranks ran: {:?}", marks(dir));
    let out = bed.wharf(&["cancel", &id.to_string()]);
    assert!(out.status.success(), "{}", stderr(&out));
    bed.wait_done(id, Duration::from_secs(30));
    assert!(marks(dir).is_empty(), "ranks ran: {:?}", marks(dir));
}
