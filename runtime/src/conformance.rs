//! The conformance suite every [`Backend`] runs (STYLE: one suite, every implementation, the
//! fake included). Call [`run`] from a test with a backend and a way to make specs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::ErrorKind;
use crate::jobdir::JobDir;
use crate::launcher::JobStatus;
use crate::spec::{ContainerSpec, Outcome};

/// Where the suite may work and how it makes a spec for a command.
#[derive(Debug)]
pub struct Suite {
    /// A scratch directory the suite owns (job dirs and output files go here).
    pub dir: PathBuf,
    /// A complete spec for running in this backend; the suite sets `id`, `argv`, output files
    /// and the time limit.
    pub template: ContainerSpec,
}

impl Suite {
    fn spec(&self, name: &str, argv: &[&str], time_limit: Option<u64>) -> (JobDir, ContainerSpec) {
        let mut s = self.template.clone();
        s.id = format!("{}-{name}-{}", self.template.id, std::process::id());
        s.argv = argv.iter().map(|a| a.to_string()).collect();
        s.stdout = self.dir.join(format!("{name}.out"));
        s.stderr = s.stdout.clone();
        s.time_limit = time_limit;
        (JobDir::new(self.dir.join(format!("job-{name}"))), s)
    }
}

/// Waits for the job in `dir` to end (at most `limit`) and returns its outcome; panics,
/// naming the backend, if it is lost or does not end.
pub fn wait(b: &dyn Backend, dir: &JobDir, limit: Duration) -> Outcome {
    let deadline = Instant::now() + limit;
    loop {
        match b.status(dir) {
            JobStatus::Exited(o) => return o,
            JobStatus::Lost(why) => panic!("[{}] job lost: {why}", b.name()),
            JobStatus::Running { .. } => {}
        }
        assert!(
            Instant::now() < deadline,
            "[{}] job in {} did not end in {limit:?}",
            b.name(),
            dir.path().display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_started(b: &dyn Backend, dir: &JobDir) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !matches!(
        b.status(dir),
        JobStatus::Running {
            started_ms: Some(_),
            ..
        }
    ) {
        assert!(
            Instant::now() < deadline,
            "[{}] job never started",
            b.name()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The job's mounts (its root, layer, image) lived in its own mount namespace: none is seen
/// from here, the node's.
fn no_mount_under(n: &str, dir: &JobDir) {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let path = dir.path().to_string_lossy();
    let leaked: Vec<&str> = table
        .lines()
        .filter(|l| l.contains(path.as_ref()))
        .collect();
    assert!(
        leaked.is_empty(),
        "[{n}] the node has the job's mounts: {leaked:?}"
    );
}

/// Runs every case against `b`. Panics with the backend's name on the first failure.
pub fn run(b: &dyn Backend, suite: &Suite) {
    let n = b.name();
    // Exit codes come back as they are.
    for (name, argv, code) in [
        ("true", vec!["/bin/true"], 0),
        ("exit3", vec!["/bin/sh", "-c", "exit 3"], 3),
    ] {
        let (dir, spec) = suite.spec(name, &argv, Some(60));
        b.launch(&dir, &spec)
            .unwrap_or_else(|e| panic!("[{n}] launch {name}: {e}"));
        let o = wait(b, &dir, Duration::from_secs(30));
        assert_eq!(
            (o.exit_code, o.error.as_deref()),
            (Some(code), None),
            "[{n}] {name}: {o:?}"
        );
        assert!(
            o.started_ms.is_some_and(|s| s <= o.ended_ms),
            "[{n}] {name} times: {o:?}"
        );
        assert!(
            !o.oom && !o.timed_out && !o.cancelled,
            "[{n}] {name}: {o:?}"
        );
        // A second launch into the same directory is refused.
        let again = b.launch(&dir, &spec).expect_err("second launch accepted");
        assert_eq!(again.kind, ErrorKind::InvalidInput, "[{n}] {again}");
        // Cancel after the end is fine; remove is idempotent.
        b.cancel(&dir)
            .unwrap_or_else(|e| panic!("[{n}] cancel of ended job: {e}"));
        b.remove(&dir)
            .unwrap_or_else(|e| panic!("[{n}] remove: {e}"));
        b.remove(&dir)
            .unwrap_or_else(|e| panic!("[{n}] second remove: {e}"));
        assert!(!dir.path().exists(), "[{n}] directory remains");
        no_mount_under(n, &dir);
    }

    // Cancel: ends within the grace period, reported as cancelled; remove refused before.
    let (dir, spec) = suite.spec("cancel", &["/bin/sleep", "30"], Some(60));
    b.launch(&dir, &spec)
        .unwrap_or_else(|e| panic!("[{n}] launch: {e}"));
    wait_started(b, &dir);
    let err = b.remove(&dir).expect_err("removed a running job");
    assert_eq!(err.kind, ErrorKind::InvalidInput, "[{n}] {err}");
    let asked = Instant::now();
    b.cancel(&dir)
        .unwrap_or_else(|e| panic!("[{n}] cancel: {e}"));
    b.cancel(&dir)
        .unwrap_or_else(|e| panic!("[{n}] second cancel: {e}"));
    let o = wait(b, &dir, Duration::from_secs(spec.grace_secs + 10));
    assert!(o.cancelled && !o.timed_out, "[{n}] cancel: {o:?}");
    no_mount_under(n, &dir);
    assert!(
        asked.elapsed() < Duration::from_secs(spec.grace_secs + 3),
        "[{n}] cancel took {:?}",
        asked.elapsed()
    );
    b.remove(&dir)
        .unwrap_or_else(|e| panic!("[{n}] remove: {e}"));

    // Time limit.
    let (dir, spec) = suite.spec("limit", &["/bin/sleep", "30"], Some(1));
    b.launch(&dir, &spec)
        .unwrap_or_else(|e| panic!("[{n}] launch: {e}"));
    let o = wait(b, &dir, Duration::from_secs(1 + spec.grace_secs + 10));
    assert!(o.timed_out && !o.cancelled, "[{n}] time limit: {o:?}");
    no_mount_under(n, &dir);
    b.remove(&dir)
        .unwrap_or_else(|e| panic!("[{n}] remove: {e}"));

    // An unknown directory is lost, not an error; cancel and remove of it are no-ops.
    let ghost = JobDir::new(suite.dir.join("never-launched"));
    assert!(
        matches!(b.status(&ghost), JobStatus::Lost(_)),
        "[{n}] ghost status"
    );
    b.cancel(&ghost)
        .unwrap_or_else(|e| panic!("[{n}] cancel ghost: {e}"));
    b.remove(&ghost)
        .unwrap_or_else(|e| panic!("[{n}] remove ghost: {e}"));
}

/// A spec template with everything but the command, for backends that run `rootfs`.
pub fn template(id: &str, rootfs: &Path, uid: u32, gid: u32) -> ContainerSpec {
    ContainerSpec {
        id: id.into(),
        rootfs: rootfs.to_path_buf(),
        argv: vec![],
        env: vec!["PATH=/usr/bin:/bin".into()],
        cwd: "/".into(),
        uid,
        gid,
        groups: vec![gid],
        root_host_id: 65534,
        hostname: "conformance".into(),
        memory: Some(256 << 20),
        cpus: Some(1),
        cpuset: vec![],
        pids: Some(256),
        tmp_size: 16 << 20,
        shm_size: 16 << 20,
        stdout: PathBuf::new(),
        stderr: PathBuf::new(),
        append_output: false,
        capture_stdout: false,
        capture_stderr: false,
        capture_stdin: false,
        time_limit: None,
        grace_secs: 1,
        cgroup_parent: "wharf-conformance".into(),
        memlock: None,
        binds: vec![],
        rootfs_partition: None,
        image_digest: None,
        stack: None,
        remap_root: false,
        writable: false,
        idle: false,
        hold: false,
        docker: None,
        identity: None,
        devices: vec![],
        tmp_files: vec![],
        job_cgroup: None,
    }
}
