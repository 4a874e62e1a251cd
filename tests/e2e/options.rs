//! Per-job sandbox options: user binds within the admin's allow list, and root inside (the
//! user outside).

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::harness::*;

fn shared_dir() -> tempfile::TempDir {
    let d = scratch("wharf-allowed-");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn user_binds_only_under_allowed_paths_and_only_where_the_user_can_reach() {
    if !can_run("user_binds_only_under_allowed_paths_and_only_where_the_user_can_reach") {
        return;
    }
    let shared = shared_dir();
    let c = Cluster::start_with(&format!(
        "allowed_mounts = [\"{}\"]",
        shared.path().display()
    ));
    c.import_tiny();
    let (alice, bob) = (user("wharf-alice"), user("wharf-bob"));
    let data = shared.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("in.txt"), "shared input\n").unwrap();
    std::os::unix::fs::symlink("/etc", shared.path().join("sneaky")).unwrap();
    let private = shared.path().join("bob-private");
    std::fs::create_dir_all(private.join("inner")).unwrap();
    nix::unistd::chown(&private, Some(bob.uid.into()), Some(bob.gid.into())).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();

    let bind = format!("{}:/input:ro", data.display());
    let out = c.run_sh(
        &alice,
        &["--image", "tiny", "--mount", &bind],
        "cat /input/in.txt; (echo x > /input/y) 2>/dev/null || echo ro",
    );
    assert_eq!(stdout(&out), "shared input\nro\n", "{}", stderr(&out));

    let cases = [
        (
            "/etc:/x".to_string(),
            "is not under a path this node allows",
        ),
        (
            format!("{}:/x", shared.path().join("sneaky").display()),
            "/etc is not under a path this node allows",
        ),
        (
            format!("{}:/x", private.join("inner").display()),
            "you cannot reach",
        ),
    ];
    for (bind, expect) in cases {
        let out = c.wharf_as(
            &alice,
            &[
                "run",
                "--image",
                "tiny",
                "--mount",
                &bind,
                "--",
                "/bin/true",
            ],
        );
        assert_ne!(out.status.code(), Some(0), "{bind} was allowed");
        assert!(
            stderr(&out).contains(expect),
            "{bind}: {expect:?} not in {}",
            stderr(&out)
        );
    }
    // A malformed bind is refused at submit, and nothing is stored.
    let out = c.wharf_as(
        &alice,
        &["submit", "--mount", "relative:/x", "--wrap", "true"],
    );
    assert!(
        stderr(&out).contains("is not SOURCE:DEST"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn remapped_root_is_root_inside_and_the_user_outside() {
    if !can_run("remapped_root_is_root_inside_and_the_user_outside") {
        return;
    }
    let shared = shared_dir();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = Cluster::start_with(&format!("mounts = [\"{}\"]", shared.path().display()));
    c.import_tiny();
    let alice = user("wharf-alice");
    let file = shared.path().join("made-as-root");
    let script = format!(
        "id -u; id -g; grep CapEff /proc/self/status; touch {}",
        file.display()
    );
    let out = c.run_sh(&alice, &["--image", "tiny", "--remap-root"], &script);
    assert_eq!(
        stdout(&out),
        "0\n0\nCapEff:\t0000000000000000\n",
        "{}",
        stderr(&out)
    );
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (alice.uid, alice.gid),
        "root inside is the user outside"
    );
}

#[test]
fn writable_jobs_change_their_own_copy_of_the_image_only() {
    if !can_run("writable_jobs_change_their_own_copy_of_the_image_only") {
        return;
    }
    let c = Cluster::start();
    c.import_tiny();
    let alice = user("wharf-alice");
    let run = |args: &[&str], script: &str| {
        let mut all = vec!["run", "--image", "tiny", "--mem", "64M"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "/bin/sh", "-c", script]);
        c.wharf_as(&alice, &all)
    };
    // Root inside may change the image's root-owned files (in its own layer).
    let out = run(
        &["--writable", "--remap-root"],
        "echo added > /etc/added && cat /etc/added && echo 'exit 7' > /bin/false && \
         /bin/sh /bin/false; echo status $?",
    );
    assert_eq!(stdout(&out), "added\nstatus 7\n", "{}", stderr(&out));
    // The user may not, though the root is writable; permissions still hold.
    let out = run(
        &["--writable"],
        "echo x > /etc/added2 2>&1; echo x > /tmp/ok && echo tmp ok",
    );
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.contains("Permission denied"), "{text}");
    assert!(!text.contains("Read-only"), "{text}");
    // A layer is bounded by the job's memory limit (its size, and the cgroup its pages are
    // charged to): it cannot fill the node.
    let out = run(
        &["--writable", "--remap-root"],
        "dd if=/dev/zero of=/big bs=1M count=200 2>/dev/null && echo wrote all",
    );
    assert!(!stdout(&out).contains("wrote all"), "{}", stdout(&out));
    // The next job, and the shared image, are untouched; a plain job's root is read-only.
    let out = run(
        &[],
        "cat /etc/added 2>/dev/null || echo absent; /bin/false; echo status $?; \
         echo x > /etc/added 2>&1",
    );
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(text.starts_with("absent\nstatus 1\n"), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");
    // The node's own filesystem is never writable: refused at submit, nothing queued.
    let out = c.wharf_as(
        &alice,
        &["submit", "--image", "host", "--writable", "--wrap", "true"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("`writable` needs an image"),
        "{}",
        stderr(&out)
    );
}

/// `wharf run` (and srun outside a job) passes every task's output on, as srun does, and
/// leaves no output file behind unless one was named. Before, only rank 0's output came back
/// and each run left `wharf-ID.out` (and `.rankR` files) in the directory it ran from.
#[test]
fn run_passes_on_every_tasks_output_and_leaves_no_file_it_was_not_asked_for() {
    if !can_run("run_passes_on_every_tasks_output_and_leaves_no_file_it_was_not_asked_for") {
        return;
    }
    let c = Cluster::start();
    let u = user("wharf-runout");
    let out = c.run_sh(
        &u,
        &["--image", "host", "-n", "2", "-c", "1"],
        "echo task $SLURM_PROCID; echo oops $SLURM_PROCID >&2",
    );
    assert!(out.status.success(), "{}\n{}", stderr(&out), c.log());
    // Each stream where srun puts it: the tasks' errors on stderr.
    let (text, errors) = (stdout(&out), stderr(&out));
    for line in ["task 0\n", "task 1\n"] {
        assert!(text.contains(line), "{line:?} not in {text:?}");
    }
    for line in ["oops 0\n", "oops 1\n"] {
        assert!(errors.contains(line), "{line:?} not in {errors:?}");
        assert!(!text.contains(line), "{line:?} in {text:?}");
    }
    let left = |prefix: &str| -> Vec<String> {
        std::fs::read_dir(c.home(&u))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect()
    };
    assert!(left("wharf-").is_empty(), "{:?}", left("wharf-"));
    // From a directory the user may not write in, the files go to their home, and go.
    let ro = c.dir.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    let out = setpriv(&u)
        .arg(wharf_bin())
        .args(["run", "--image", "host", "--", "sh", "-c", "echo from ro"])
        .env("WHARF_SOCKET", &c.socket)
        .env("HOME", c.home(&u))
        .current_dir(&ro)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "from ro\n");
    assert!(left("wharf-").is_empty(), "{:?}", left("wharf-"));
    // Files it names are the user's: kept, and still passed on.
    let out = c.run_sh(
        &u,
        &["--image", "host", "-n", "2", "-c", "1", "-o", "mine-%t.out"],
        "echo kept $SLURM_PROCID",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("kept 1\n"), "{}", stdout(&out));
    let mut kept = left("mine-");
    kept.sort();
    assert_eq!(kept, ["mine-0.out", "mine-1.out"]);
}
