//! A job's directory on the node is 0711 (the container's ids pass through it to the root
//! bound inside), so any user may guess the names in it: every file the agent and the shim
//! write there (spec, pid, shim log, start time, timeline, stop order, outcome) is 0600,
//! whatever the umask the daemons start under.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::harness::*;

/// Every regular file under `dir` (not following symlinks).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    for e in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if meta.is_dir() {
            files.extend(files_under(&e.path()));
        } else if meta.is_file() {
            files.push(e.path());
        }
    }
    files
}

/// Asserts that `snoop` can read none of the files under `dir` and that each is 0600; returns
/// their names.
fn assert_private(c: &Cluster, snoop: &User, dir: &Path, when: &str) -> Vec<String> {
    let mut names = Vec::new();
    for f in files_under(dir) {
        let Ok(meta) = std::fs::metadata(&f) else {
            continue; // removed meanwhile
        };
        let read = as_user(snoop, &c.dir, "/bin/cat", &[f.to_str().unwrap()], &c.socket);
        let name = f.strip_prefix(dir).unwrap().display().to_string();
        assert!(
            !read.status.success(),
            "{when}: another user read {name}: {:?}",
            String::from_utf8_lossy(&read.stdout)
        );
        assert_eq!(
            meta.permissions().mode() & 0o7777,
            0o600,
            "{when}: mode of {name}"
        );
        names.push(name);
    }
    names.sort();
    names
}

/// Waits until `path` exists (true) or `limit` passes (false).
fn appears(path: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn another_user_cannot_read_any_file_of_a_job_directory() {
    if !can_run("another_user_cannot_read_any_file_of_a_job_directory") {
        return;
    }
    // The daemons inherit this: the modes must not depend on it.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let mut c = Cluster::start();
    let (owner, snoop) = (user("whdock-owner"), user("whdock-snoop"));
    let jobs = c.dir.join("agent/jobs");

    // While it runs, and while it winds down after a cancel (the agent's stop order).
    let id = submitted_id(&c.wharf_as(&owner, &["submit", "--wrap", "trap '' TERM; sleep 60"]));
    c.wait_running(id);
    let dir = jobs.join(id.to_string());
    assert!(appears(&dir.join("started"), Duration::from_secs(10)));
    let running = assert_private(&c, &snoop, &dir, "running");
    for f in ["shim.log", "shim.pid", "spec.json", "started", "timeline"] {
        assert!(running.iter().any(|n| n == f), "{f} not in {running:?}");
    }
    let ok = c.wharf(&["cancel", &id.to_string()]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(
        appears(&dir.join("stop"), Duration::from_secs(10)),
        "the agent never recorded the stop order"
    );
    let stopping = assert_private(&c, &snoop, &dir, "stopping");
    assert!(stopping.iter().any(|n| n == "stop"), "{stopping:?}");
    c.wait_done(id, Duration::from_secs(30));

    // After the end: with the daemons down, the directory stays as the shim left it.
    let id = submitted_id(&c.wharf_as(&owner, &["submit", "--wrap", "sleep 2"]));
    c.wait_running(id);
    c.kill9();
    let dir = jobs.join(id.to_string());
    assert!(
        appears(&dir.join("outcome.json"), Duration::from_secs(30)),
        "the shim never wrote its outcome"
    );
    let ended = assert_private(&c, &snoop, &dir, "ended");
    assert!(ended.iter().any(|n| n == "outcome.json"), "{ended:?}");
    c.spawn();
    c.wait_node_up();
    c.wait_done(id, Duration::from_secs(30));
}
