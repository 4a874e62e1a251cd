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
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--time", "2s", "--wrap", "sleep 60"]));
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "TIMEOUT", "{job}");
    let ran = job["end_time"].as_u64().unwrap() - job["start_time"].as_u64().unwrap();
    assert!((2000..2000 + 2000 + 1500).contains(&ran), "ran {ran} ms");
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
    let asked = Instant::now();
    assert!(c
        .wharf_as(&carol, &["cancel", &id.to_string()])
        .status
        .success());
    let job = c.wait_done(id, Duration::from_secs(15));
    let took = asked.elapsed();
    assert_eq!(job["state"], "CANCELLED", "{job}");
    assert!(took < Duration::from_secs(2 + 3), "cancel took {took:?}");
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
