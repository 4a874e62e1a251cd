//! Limits, cancellation and who may do what.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::*;

#[test]
fn other_users_cannot_cancel_or_read_a_job_but_root_can() {
    if !can_run("other_users_cannot_cancel_or_read_a_job_but_root_can") {
        return;
    }
    let c = Cluster::start();
    let (alice, bob) = (user("wharf-alice"), user("wharf-bob"));
    let id = submitted_id(&c.wharf_as(
        &alice,
        &["submit", "--wrap", "echo secret-$WHARF_JOB_ID; sleep 60"],
    ));
    c.wait_running(id);

    let refused = c.wharf_as(&bob, &["cancel", &id.to_string()]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("belongs to another user"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(c.job(id)["state"], "RUNNING");

    let seen: serde_json::Value = serde_json::from_slice(
        &c.wharf_as(&bob, &["show", &id.to_string(), "--json"])
            .stdout,
    )
    .unwrap();
    assert!(seen["spec"].is_null(), "bob sees alice's command: {seen}");
    let output = c.job(id)["spec"]["output"]
        .as_str()
        .unwrap()
        .replace("%j", &id.to_string());
    let path = c.home(&alice).join(output);
    let read = as_user(
        &bob,
        &c.dir,
        "/bin/cat",
        &[path.to_str().unwrap()],
        &c.socket,
    );
    assert!(!read.status.success(), "bob read alice's output");
    let read = as_user(
        &alice,
        &c.dir,
        "/bin/cat",
        &[path.to_str().unwrap()],
        &c.socket,
    );
    assert_eq!(stdout(&read), format!("secret-{id}\n"));

    let ok = c.wharf(&["cancel", &id.to_string()]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert_eq!(
        c.wait_done(id, Duration::from_secs(15))["state"],
        "CANCELLED"
    );
    // Cancelling an ended job says so and changes nothing.
    let again = c.wharf(&["cancel", &id.to_string()]);
    assert!(
        stderr(&again).contains("already ended"),
        "{}",
        stderr(&again)
    );
}

#[test]
fn memory_hog_is_killed_and_reported_out_of_memory() {
    if !can_run("memory_hog_is_killed_and_reported_out_of_memory") {
        return;
    }
    let c = Cluster::start();
    c.import_tiny();
    let alice = user("wharf-alice");
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit",
            "--image",
            "tiny",
            "--mem",
            "32M",
            "--wrap",
            "tail /dev/zero",
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(60));
    assert_eq!(job["state"], "OUT_OF_MEMORY", "{job}");
    assert!(job["reason"].as_str().unwrap().contains("32M"), "{job}");
}

#[test]
fn job_over_its_time_limit_is_killed_and_reported_timed_out() {
    if !can_run("job_over_its_time_limit_is_killed_and_reported_timed_out") {
        return;
    }
    let c = Cluster::start();
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit",
            "--time",
            "2s",
            "--chdir",
            home.to_str().unwrap(),
            "--wrap",
            "sleep 60",
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "TIMEOUT", "{job}");
    // Its output says why it stopped, as slurmstepd's line does.
    let out = std::fs::read_to_string(home.join(format!("wharf-{id}.out"))).unwrap();
    assert!(
        out.contains(&format!("*** JOB {id} ON ")) && out.contains("DUE TO TIME LIMIT ***"),
        "{out}"
    );
    // Never before its limit; after it, within the grace period (2 s) and a margin for busy
    // cores that only a job left running (60 s) would exceed. Both times are the shim's.
    let ran = job["end_time"].as_u64().unwrap() - job["start_time"].as_u64().unwrap();
    assert!((2000..2000 + 2000 + 10_000).contains(&ran), "ran {ran} ms");
}

/// The job's program is not pid 1 of its pid namespace (a small init is): signals it sends
/// itself, and a cancel's SIGTERM, end it as they would anywhere. Before, the kernel dropped
/// them: `kill -9 $$` ended COMPLETED 0:0, and a cancelled shell went on to its next command
/// and ended with 0.
#[test]
fn signals_reach_the_jobs_program_and_its_death_by_one_is_recorded() {
    if !can_run("signals_reach_the_jobs_program_and_its_death_by_one_is_recorded") {
        return;
    }
    let c = Cluster::start();
    let dave = user("wharf-dave");
    let home = c.home(&dave);
    let ended = |script: &str| {
        let id = submitted_id(&c.wharf_as(
            &dave,
            &[
                "submit",
                "--chdir",
                home.to_str().unwrap(),
                "--wrap",
                script,
            ],
        ));
        (id, c.wait_done(id, Duration::from_secs(30)))
    };
    let (_, job) = ended("kill -9 $$; echo still");
    assert_eq!(job["state"], "FAILED", "{job}");
    assert_eq!(job["exit"]["signal"], 9, "{job}");
    let (id, job) = ended("kill -TERM $$; echo still");
    assert_eq!(job["exit"]["signal"], 15, "{job}");
    let out = std::fs::read_to_string(home.join(format!("wharf-{id}.out"))).unwrap();
    assert!(!out.contains("still"), "{out}");
    // A program that exits is recorded with its code, as before.
    let (_, job) = ended("exit 7");
    assert_eq!(
        (job["state"].as_str(), job["exit"]["code"].as_i64()),
        (Some("FAILED"), Some(7)),
        "{job}"
    );
    // Orphans are reaped: none is left a zombie while the job runs.
    let (id, job) =
        ended("for i in 1 2 3; do (sleep 0 &); done; sleep 1; ps -eo stat= | grep -c Z; true");
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let out = std::fs::read_to_string(home.join(format!("wharf-{id}.out"))).unwrap();
    assert_eq!(out.trim(), "0", "zombies: {out}");
    // Cancelled, a shell is ended by the SIGTERM, and goes no further.
    let id = submitted_id(&c.wharf_as(
        &dave,
        &[
            "submit",
            "--chdir",
            home.to_str().unwrap(),
            "--wrap",
            "sleep 100; echo end",
        ],
    ));
    c.wait_running(id);
    std::thread::sleep(Duration::from_millis(300));
    let job = c.cancel_as(&dave, id);
    assert_eq!(job["exit"]["signal"], 15, "{job}");
    let out = std::fs::read_to_string(home.join(format!("wharf-{id}.out"))).unwrap();
    assert!(!out.contains("\nend"), "{out}");
    assert!(out.contains(&format!("*** JOB {id} ON ")), "{out}");
    assert!(!out.contains("TIME LIMIT"), "{out}");
}

/// An admin raises a running job's time limit and it runs past the old one; its owner then
/// lowers it below what it has run, and it ends TIMEOUT at once, as under Slurm.
#[test]
fn a_running_jobs_time_limit_changed_by_update_holds_on_its_node() {
    if !can_run("a_running_jobs_time_limit_changed_by_update_holds_on_its_node") {
        return;
    }
    let c = Cluster::start();
    let gail = user("wharf-gail");
    let id = submitted_id(&c.wharf_as(&gail, &["submit", "--time", "3s", "--wrap", "sleep 60"]));
    c.wait_running(id);
    let out = c.wharf_as(&gail, &["update", &id.to_string(), "--time", "1h"]);
    assert!(!out.status.success(), "the owner raised it");
    let out = c.wharf(&["update", &id.to_string(), "--time", "1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::thread::sleep(Duration::from_secs(6));
    let job = c.job(id);
    assert_eq!(job["state"], "RUNNING", "past its old limit: {job}");
    let asked = now_ms();
    let out = c.wharf_as(&gail, &["update", &id.to_string(), "--time", "2s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "TIMEOUT", "{job}");
    // Within the shim's second, the grace period (2 s) and a margin for busy cores.
    let took = job["end_time"].as_u64().unwrap().saturating_sub(asked);
    assert!(took < 10_000, "took {took} ms: {job}");
}

#[test]
fn cancel_removes_the_whole_process_tree_within_the_grace_period() {
    if !can_run("cancel_removes_the_whole_process_tree_within_the_grace_period") {
        return;
    }
    let c = Cluster::start();
    let carol = user("wharf-carol");
    // The shell and its children ignore SIGTERM, so only the SIGKILL after the grace period
    // (2 s here) can end them.
    let script = "trap '' TERM; sleep 300 & sleep 300 & (sleep 300; true) & wait";
    let id = submitted_id(&c.wharf_as(&carol, &["submit", "--wrap", script]));
    c.wait_running(id);
    let pgrep = || {
        Command::new("pgrep")
            .args(["-u", &carol.name])
            .output()
            .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while stdout(&pgrep()).lines().count() < 4 {
        assert!(Instant::now() < deadline, "job processes never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
    let asked = now_ms();
    assert!(c
        .wharf_as(&carol, &["cancel", &id.to_string()])
        .status
        .success());
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "CANCELLED", "{job}");
    // From the cancel to the end the shim recorded: the grace period (2 s: the job ignores
    // TERM, so only the KILL after it ends the job), plus a margin for busy cores that only a
    // job left running (300 s) would exceed.
    let took = job["end_time"].as_u64().unwrap().saturating_sub(asked);
    assert!(
        (1900..2000 + 10_000).contains(&took),
        "cancel took {took} ms: {job}"
    );
    // The order reaches the agent once; it is not repeated (a busy loop) through the grace
    // period.
    let stops = c
        .log()
        .lines()
        .filter(|l| {
            l.contains("stopping job") && l.split_whitespace().any(|w| w == format!("job={id}"))
        })
        .count();
    assert_eq!(stops, 1, "stop order passed {stops} times:\n{}", c.log());
    assert_eq!(stdout(&pgrep()), "", "processes of the job remain");
    let cgroups = wharf_runtime::cgroup_dirs(&format!("/{}/wharf-{id}", c.cgroup_parent));
    assert!(cgroups.is_empty(), "cgroups remain: {cgroups:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(c.dir.to_str().unwrap()), "mounts remain");
    // The agent forgets the job once the controller has its result.
    let job_dir = c.dir.join("agent/jobs").join(id.to_string());
    let deadline = Instant::now() + Duration::from_secs(10);
    while job_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "job directory {} remains",
            job_dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn image_commands_use_the_configured_store_by_default() {
    if !can_run("image_commands_use_the_configured_store_by_default") {
        return;
    }
    let d = scratch("wharf-store-");
    let store = d.path().join("images");
    let config = d.path().join("wharf.toml");
    std::fs::write(
        &config,
        format!("[agent]\nimage_store = \"{}\"\n", store.display()),
    )
    .unwrap();
    let rootfs = d.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::write(rootfs.join("bin/x"), "x").unwrap();
    let wharf = |args: &[&str]| {
        Command::new(wharf_bin())
            .args(args)
            .env_remove("WHARF_IMAGE_STORE")
            .output()
            .unwrap()
    };
    let cfg = config.to_str().unwrap();
    let out = wharf(&[
        "image",
        "import",
        rootfs.to_str().unwrap(),
        "--name",
        "mine",
        "--config",
        cfg,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        wharf_images::ImageStore::open(store)
            .unwrap()
            .get("mine")
            .is_ok(),
        "not imported into the configured store"
    );
    let ls = wharf(&["image", "ls", "--config", cfg]);
    assert!(stdout(&ls).contains("mine"), "{}", stdout(&ls));
}

/// A process of `user`'s holding a read lease on `file` (which they own), as a file server
/// would: while it holds it, an open for writing does not succeed until the kernel has broken
/// the lease (`fs.lease-break-time`, 45 s by default). It says `held` once it holds the lease
/// and `breaking` when an open has asked the kernel to break it.
struct LeaseHolder {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl LeaseHolder {
    fn start(user: &User, file: &std::path::Path) -> LeaseHolder {
        // F_SETLEASE = 1024, F_RDLCK = 0 (Linux).
        let perl = "$| = 1; $SIG{IO} = sub { print \"breaking\\n\" }; \
            open(my $f, '<', $ARGV[0]) or die \"open: $!\"; \
            fcntl($f, 1024, 0) or die \"lease: $!\"; print \"held\\n\"; sleep 1 while 1";
        let mut child = setpriv(user)
            .args(["perl", "-e", perl])
            .arg(file)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("perl");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let holder = LeaseHolder { child, lines };
        holder.expect("held");
        holder
    }

    /// Waits (20 s at most) for the holder to say `what`.
    fn expect(&self, what: &str) {
        let got = self.lines.recv_timeout(Duration::from_secs(20));
        assert_eq!(got.as_deref(), Ok(what), "lease holder");
    }
}

impl Drop for LeaseHolder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Milliseconds since the epoch, as the daemons record times.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Submits, as `user`, a job taking every CPU of the node whose output file `name` (in their
/// directory, owned by them) is held by a lease; returns the job and the holder once the launch
/// waits on it (the holder has been asked to give the lease up) and the job is STARTING.
/// Whether this node lets processes take file leases (`fs.leases-enable`); says why not, or
/// fails under WHARF_TEST_STRICT=1.
fn leases_enabled(test: &str) -> bool {
    let on = std::fs::read_to_string("/proc/sys/fs/leases-enable").is_ok_and(|v| v.trim() != "0");
    if !on {
        let why = format!("{test}: file leases are off on this node (fs.leases-enable = 0)");
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
    }
    on
}

fn held_in_starting(c: &Cluster, user: &User, name: &str, opts: &[&str]) -> (u64, LeaseHolder) {
    let file = c.home(user).join(name);
    std::fs::write(&file, "").unwrap();
    nix::unistd::chown(&file, Some(user.uid.into()), Some(user.gid.into())).unwrap();
    let holder = LeaseHolder::start(user, &file);
    let cpus = c.node_cpus().to_string();
    let mut args = vec!["submit", "-c", &cpus, "-o", name];
    args.extend_from_slice(opts);
    args.extend_from_slice(&["--wrap", "echo ran"]);
    let id = submitted_id(&c.wharf_as(user, &args));
    holder.expect("breaking");
    assert_eq!(c.job(id)["state"], "STARTING", "{}", c.job(id));
    (id, holder)
}

#[test]
fn a_job_held_in_starting_is_cancelled_promptly_by_its_owner_or_root_and_frees_its_cpus() {
    if !can_run(
        "a_job_held_in_starting_is_cancelled_promptly_by_its_owner_or_root_and_frees_its_cpus",
    ) {
        return;
    }
    if !leases_enabled(
        "a_job_held_in_starting_is_cancelled_promptly_by_its_owner_or_root_and_frees_its_cpus",
    ) {
        return;
    }
    let c = Cluster::start();
    let alice = user("whlife-alice");
    for (who, as_root) in [("owner", false), ("root", true)] {
        let (id, _holder) = held_in_starting(&c, &alice, &format!("held-{who}.out"), &[]);
        // It holds the node's CPUs: a job needing one waits.
        let next = submitted_id(&c.wharf_as(&alice, &["submit", "-c", "1", "--wrap", "true"]));
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(c.job(next)["state"], "PENDING", "{}", c.job(next));
        let asked = now_ms();
        let cancel = if as_root {
            c.wharf(&["cancel", &id.to_string()])
        } else {
            c.wharf_as(&alice, &["cancel", &id.to_string()])
        };
        assert!(cancel.status.success(), "{who}: {}", stderr(&cancel));
        // The kernel would give the lease up after 45 s: the cancel must not wait for it.
        let job = c.wait_done(id, Duration::from_secs(40));
        assert_eq!(job["state"], "CANCELLED", "{who}: {job}");
        assert!(job["start_time"].is_null(), "{who}: {job}");
        let took = job["end_time"].as_u64().unwrap().saturating_sub(asked);
        assert!(took < 10_000, "{who}: the cancel took {took} ms: {job}");
        // Its CPUs are free again.
        let done = c.wait_done(next, Duration::from_secs(30));
        assert_eq!(done["state"], "COMPLETED", "{who}: {done}");
    }
}

#[test]
fn a_job_held_in_starting_ends_at_its_time_limit() {
    if !can_run("a_job_held_in_starting_ends_at_its_time_limit") {
        return;
    }
    if !leases_enabled("a_job_held_in_starting_ends_at_its_time_limit") {
        return;
    }
    let c = Cluster::start();
    let alice = user("whlife-alice");
    let (id, _holder) = held_in_starting(&c, &alice, "held-time.out", &["--time", "2s"]);
    let job = c.wait_done(id, Duration::from_secs(40));
    assert_eq!(job["state"], "TIMEOUT", "{job}");
    assert!(job["start_time"].is_null(), "{job}");
    // The limit counts from the launch, which began after the submit; 45 s would be the
    // kernel giving the lease up.
    let took = job["end_time"].as_u64().unwrap() - job["submit_time"].as_u64().unwrap();
    assert!(
        (2000..12_000).contains(&took),
        "ended {took} ms after its submit: {job}"
    );
}

#[test]
fn a_fifo_as_output_fails_the_job_within_seconds_with_the_reason() {
    if !can_run("a_fifo_as_output_fails_the_job_within_seconds_with_the_reason") {
        return;
    }
    let c = Cluster::start();
    let alice = user("whlife-alice");
    let home = c.home(&alice);
    for name in ["pipe.out", "read.err"] {
        nix::unistd::mkfifo(
            &home.join(name),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        nix::unistd::chown(
            &home.join(name),
            Some(alice.uid.into()),
            Some(alice.gid.into()),
        )
        .unwrap();
    }
    // One with nobody reading it, one with a reader (the open succeeds; what it opened is
    // refused).
    // (Opened read-write: a FIFO's read-only open would wait for a writer.)
    let fifo = std::fs::File::options()
        .read(true)
        .write(true)
        .open(home.join("read.err"))
        .unwrap();
    let mut reader = Command::new("sleep")
        .arg("600")
        .stdin(fifo)
        .spawn()
        .unwrap();
    let cpus = c.node_cpus().to_string();
    for opts in [["-o", "pipe.out"], ["-e", "read.err"]] {
        let mut args = vec!["submit", "-c", &cpus];
        args.extend_from_slice(&opts);
        args.extend_from_slice(&["--wrap", "echo ran"]);
        let id = submitted_id(&c.wharf_as(&alice, &args));
        let job = c.wait_done(id, Duration::from_secs(30));
        assert_eq!(job["state"], "FAILED", "{opts:?}: {job}");
        assert!(job["start_time"].is_null(), "{job}");
        let reason = job["reason"].as_str().unwrap();
        assert!(
            reason.contains(&format!("{} is a named pipe (FIFO)", opts[1])),
            "{reason}"
        );
        let took = job["end_time"].as_u64().unwrap() - job["submit_time"].as_u64().unwrap();
        assert!(took < 10_000, "failed {took} ms after its submit: {job}");
    }
    let _ = reader.kill();
    let _ = reader.wait();
}

#[test]
fn a_dropped_cluster_leaves_no_shim_and_no_job_process() {
    if !can_run("a_dropped_cluster_leaves_no_shim_and_no_job_process") {
        return;
    }
    let c = Cluster::start();
    let alice = user("whlife-alice");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "sleep 300"]));
    c.wait_running(id);
    let pid_file = c.dir.join(format!("agent/jobs/{id}/shim.pid"));
    let text = std::fs::read_to_string(pid_file).unwrap();
    let shim: i32 = text.split_whitespace().next().unwrap().parse().unwrap();
    let cgroup = format!("/{}/wharf-{id}", c.cgroup_parent);
    let job = cgroup_procs(&cgroup);
    assert!(!job.is_empty(), "no job process in {cgroup}");
    // The shim was forked by the spawner: not a child of the dev process.
    drop(c);
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(gone(shim) && job.iter().all(|&p| gone(p))) {
        assert!(
            Instant::now() < deadline,
            "shim {shim} or job processes {job:?} outlived the cluster"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn output_is_opened_as_the_user_so_planted_links_and_root_paths_are_refused() {
    if !can_run("output_is_opened_as_the_user_so_planted_links_and_root_paths_are_refused") {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let c = Cluster::start();
    let alice = user("whlife-alice");
    // A root-owned file the user can read but not write, and a link to it planted as the
    // output file's name.
    let target = c.dir.join("root-owned");
    std::fs::write(&target, "root's\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::symlink(&target, c.home(&alice).join("link.out")).unwrap();
    let in_etc = format!("/etc/whlife-e2e-{}.out", std::process::id());
    for (output, want) in [
        ("link.out", "is a symbolic link".to_string()),
        (
            in_etc.as_str(),
            format!("cannot create output file {in_etc} as uid {}", alice.uid),
        ),
    ] {
        let id = submitted_id(&c.wharf_as(
            &alice,
            &["submit", "-o", output, "--wrap", "echo written-by-the-job"],
        ));
        let job = c.wait_done(id, Duration::from_secs(30));
        assert_eq!(job["state"], "FAILED", "{output}: {job}");
        assert!(job["start_time"].is_null(), "{output}: {job}");
        let reason = job["reason"].as_str().unwrap();
        assert!(reason.contains(&want), "{output}: {reason}");
    }
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "root's\n");
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o644));
    assert!(!std::path::Path::new(&in_etc).exists(), "{in_etc} was made");
}

#[test]
fn a_descriptor_the_daemons_inherit_reaches_no_shim_and_no_job() {
    if !can_run("a_descriptor_the_daemons_inherit_reaches_no_shim_and_no_job") {
        return;
    }
    let scratch = scratch("whlife-leak-");
    let secret = scratch.path().join("secret");
    std::fs::write(&secret, "the node's").unwrap();
    let c = Cluster::start_leaking(std::fs::File::open(&secret).unwrap());
    let holds = |pid: i32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).ok().as_deref() == Some(secret.as_path()))
    };
    // The premise: the spawner (the agent's child) inherited it, as any child would.
    let spawner = c.spawner_pid().expect("the agent's shim spawner");
    assert!(holds(spawner), "the spawner does not hold the descriptor");
    let alice = user("whlife-alice");
    let id = submitted_id(&c.wharf_as(
        &alice,
        &["submit", "--wrap", "ls -l /proc/self/fd; sleep 60"],
    ));
    c.wait_running(id);
    let text = std::fs::read_to_string(c.dir.join(format!("agent/jobs/{id}/shim.pid"))).unwrap();
    let shim: i32 = text.split_whitespace().next().unwrap().parse().unwrap();
    // A forked shim closes what the spawner holds; the job gets stdio alone.
    assert!(
        !holds(shim),
        "shim {shim} of job {id} holds the daemons' descriptor"
    );
    assert!(c.wharf(&["cancel", &id.to_string()]).status.success());
    c.wait_done(id, Duration::from_secs(15));
    let out = std::fs::read_to_string(c.home(&alice).join(format!("wharf-{id}.out"))).unwrap();
    assert!(
        !out.contains("secret"),
        "the job held the descriptor:\n{out}"
    );
    let _ = std::fs::remove_dir_all(secret.parent().unwrap());
}
