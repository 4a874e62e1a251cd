//! Crashes: running jobs survive a `kill -9` of controller and agent; jobs a node lost are
//! failed, not forgotten.

use std::time::Duration;

use crate::harness::*;

#[test]
fn running_job_survives_kill9_of_controller_and_agent() {
    if !can_run("running_job_survives_kill9_of_controller_and_agent") {
        return;
    }
    let mut c = Cluster::start();
    let alice = user("wharf-alice");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "sleep 3; echo finished"]));
    c.wait_running(id);
    c.kill9();
    std::thread::sleep(Duration::from_millis(300));
    c.spawn();
    c.wait_node_up();
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let out = c.home(&alice).join(format!("wharf-{id}.out"));
    assert_eq!(std::fs::read_to_string(out).unwrap(), "finished\n");
}

#[test]
fn job_lost_by_its_node_ends_as_node_fail() {
    if !can_run("job_lost_by_its_node_ends_as_node_fail") {
        return;
    }
    let mut c = Cluster::start();
    let alice = user("wharf-alice");
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "sleep 60"]));
    c.wait_running(id);
    c.kill9();
    // The node loses the job entirely (say, it was reinstalled): shim and directory gone.
    let job_dir = c.dir.join("agent/jobs").join(id.to_string());
    c.kill9_shim(id);
    std::thread::sleep(Duration::from_millis(300));
    std::fs::remove_dir_all(&job_dir).unwrap();
    c.spawn();
    c.wait_node_up();
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "NODE_FAIL", "{job}");
    assert!(
        job["reason"]
            .as_str()
            .unwrap()
            .contains("no longer has this job"),
        "{job}"
    );
    // The test took the job from its node behind the agent's back (a reinstalled node would
    // have rebooted): end what is left of it, which no agent knows of any more.
    let cgroup = format!("/{}/wharf-{id}", c.cgroup_parent);
    for _ in 0..100 {
        // The job's cgroup and its task's leaf under it, the leaf first.
        let dirs: Vec<std::path::PathBuf> = wharf_runtime::cgroup_dirs(&cgroup)
            .iter()
            .flat_map(|d| cgroup_tree(d))
            .collect();
        if dirs.iter().all(|d| std::fs::remove_dir(d).is_ok()) {
            break;
        }
        for d in &dirs {
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(wharf_runtime::cgroup_dirs(&cgroup).is_empty());
}

#[test]
fn a_killed_shim_leaves_no_process_or_cgroup_behind() {
    if !can_run("a_killed_shim_leaves_no_process_or_cgroup_behind") {
        return;
    }
    let c = Cluster::start();
    let dave = user("wharf-dave");
    let id = submitted_id(&c.wharf_as(&dave, &["submit", "--wrap", "sleep 300 & sleep 300; wait"]));
    c.wait_running(id);
    c.kill9_shim(id);
    let job = c.wait_done(id, Duration::from_secs(20));
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(
        job["reason"].as_str().unwrap().contains("supervisor died"),
        "{job}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = std::process::Command::new("pgrep")
            .args(["-u", &dave.name])
            .output()
            .unwrap();
        let cgroups = wharf_runtime::cgroup_dirs(&format!("/{}/wharf-{id}", c.cgroup_parent));
        if left.stdout.is_empty() && cgroups.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left behind: {} {cgroups:?}",
            String::from_utf8_lossy(&left.stdout)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn launches_go_on_when_the_shim_spawner_dies_and_it_ends_with_the_agent() {
    if !can_run("launches_go_on_when_the_shim_spawner_dies_and_it_ends_with_the_agent") {
        return;
    }
    let mut c = Cluster::start();
    let alice = user("wharf-alice");
    let first = c.wharf_as(&alice, &["run", "--", "/bin/echo", "one"]);
    assert_eq!(stdout(&first), "one\n", "{}", stderr(&first));
    let spawner = c.spawner_pid().expect("no shim spawner after a launch");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(spawner),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The next launch finds it gone and starts another.
    let second = c.wharf_as(&alice, &["run", "--", "/bin/echo", "two"]);
    assert_eq!(stdout(&second), "two\n", "{}", stderr(&second));
    let again = c.spawner_pid().expect("the spawner was not restarted");
    assert_ne!(again, spawner);
    // A running job outlives the agent; the spawner does not.
    let id = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "sleep 2; echo done"]));
    c.wait_running(id);
    c.kill9();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{again}")).exists() {
        let state = std::fs::read_to_string(format!("/proc/{again}/stat")).unwrap_or_default();
        if state
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the spawner outlived the agent"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    c.spawn();
    c.wait_node_up();
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "COMPLETED", "{job}");
}
