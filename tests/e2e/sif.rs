//! Apptainer SIF images: the primary partition mounted read-only at its offset, in the same
//! sandbox; corrupt, hostile or unreadable files refused with the reason.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::*;

/// Makes `dir/NAME.sif` from a small rootfs with a marker file.
fn make_sif(dir: &Path, name: &str) -> PathBuf {
    make_sif_with(dir, name, |_| {})
}

/// Makes `dir/NAME.sif` from a small rootfs with a marker file, changed by `edit` first.
fn make_sif_with(dir: &Path, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let root = dir.join(format!("{name}-root"));
    mkrootfs(&root, &["sh", "cat", "id", "ls", "sleep"]);
    std::fs::write(root.join("etc/marker"), format!("inside {name}\n")).unwrap();
    edit(&root);
    let sif = dir.join(format!("{name}.sif"));
    mksif(&root, &sif);
    sif
}

fn loops_on(file: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("loop/backing_file"))
                .is_ok_and(|b| b.trim() == file.to_str().unwrap())
        })
        .count()
}

#[test]
fn sif_image_runs_in_the_sandbox_and_leaves_no_loop_device() {
    if !can_run("sif_image_runs_in_the_sandbox_and_leaves_no_loop_device") || !sif_tools() {
        return;
    }
    let c = Cluster::start();
    let dir = scratch("wharf-sif-");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sif = make_sif(dir.path(), "good");
    let alice = user("wharf-alice");
    let out = c.run_sh(
        &alice,
        &["--image", sif.to_str().unwrap()],
        "id -u; cat /etc/marker; touch /etc/x 2>/dev/null || echo read-only",
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(
        stdout(&out),
        format!("{}\ninside good\nread-only\n", alice.uid)
    );
    // Writable, root inside: the squashfs is mapped like any image.
    let out = c.run_sh(
        &alice,
        &[
            "--image",
            sif.to_str().unwrap(),
            "--writable",
            "--remap-root",
        ],
        "echo changed > /etc/marker && cat /etc/marker",
    );
    assert_eq!(stdout(&out), "changed\n", "{}", stderr(&out));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while loops_on(&sif) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a loop device is still attached to {}",
            sif.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn corrupt_or_unreadable_sif_files_are_refused_with_the_reason() {
    if !can_run("corrupt_or_unreadable_sif_files_are_refused_with_the_reason") || !sif_tools() {
        return;
    }
    let c = Cluster::start();
    let dir = scratch("wharf-sif-");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let alice = user("wharf-alice");
    // Truncated in the middle of its partition.
    let cut = make_sif(dir.path(), "cut");
    let len = std::fs::metadata(&cut).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cut)
        .unwrap()
        .set_len(len - 100)
        .unwrap();
    // Private to root: alice may not run it even though the agent could read it.
    let secret = make_sif(dir.path(), "secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    for (file, expect) in [
        (&cut, "lies outside the file"),
        (&secret, "not readable by wharf-alice"),
    ] {
        let out = c.wharf_as(
            &alice,
            &["run", "--image", file.to_str().unwrap(), "--", "/bin/true"],
        );
        assert_ne!(out.status.code(), Some(0));
        assert!(
            stderr(&out).contains(expect),
            "{expect:?} not in {}",
            stderr(&out)
        );
    }
}

/// A SIF of the user's own whose `/etc/passwd` and `/etc/group` are FIFOs (squashfs keeps
/// them, and nodev does not stop a FIFO), owned by `user`.
fn fifo_identity_sif(dir: &Path, user: &User) -> PathBuf {
    let sif = make_sif_with(dir, "fifos", |root| {
        for name in ["etc/passwd", "etc/group"] {
            let _ = std::fs::remove_file(root.join(name));
            nix::unistd::mkfifo(
                &root.join(name),
                nix::sys::stat::Mode::from_bits_truncate(0o644),
            )
            .unwrap();
        }
    });
    nix::unistd::chown(&sif, Some(user.uid.into()), Some(user.gid.into())).unwrap();
    sif
}

/// The shim wrote the user's identity by opening the image's `/etc/passwd` and `/etc/group`
/// as root, blocking: a FIFO there held the launch past the job's time limit (a `--time 2s`
/// job was not over after 15 s). Now nothing but a regular file of the image is opened; the
/// job gets fresh files in its own layer, runs, and its time limit holds.
#[test]
fn a_fifo_identity_file_in_a_sif_neither_holds_the_launch_nor_outlives_the_time_limit() {
    if !can_run(
        "a_fifo_identity_file_in_a_sif_neither_holds_the_launch_nor_outlives_the_time_limit",
    ) || !sif_tools()
    {
        return;
    }
    let c = Cluster::start();
    let eve = user("whfr-fifo");
    let dir = scratch("wharf-sif-fifo-");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sif = fifo_identity_sif(dir.path(), &eve);
    let image = sif.to_str().unwrap();
    // Its time limit ends it.
    let submitted = std::time::Instant::now();
    let id = submitted_id(&c.wharf_as(
        &eve,
        &[
            "submit",
            "--image",
            image,
            "--time",
            "2s",
            "--wrap",
            "sleep 300",
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(30));
    let took = submitted.elapsed();
    assert_eq!(job["state"], "TIMEOUT", "{job}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(20),
        "ended {took:?} after submit (time limit 2 s): {job}"
    );
    // It runs, promptly, as the user the image now knows.
    let t = std::time::Instant::now();
    let out = c.run_sh(
        &eve,
        &["--image", image, "--time", "20s"],
        "id -un; cat /etc/passwd",
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("whfr-fifo\n"), "{text}{}", stderr(&out));
    assert!(
        text.contains(&format!("\nwhfr-fifo:x:{}:", eve.uid)),
        "{text}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
}

/// A cancel while the launch waited on the image's FIFO interrupted the open, and the job
/// ended FAILED "Interrupted system call"; the next open then waited again. Now the launch
/// does not wait on it, and a cancel during a launch always ends the job CANCELLED.
#[test]
fn a_job_whose_sif_has_fifo_identity_files_is_cancelled_not_failed() {
    if !can_run("a_job_whose_sif_has_fifo_identity_files_is_cancelled_not_failed") || !sif_tools() {
        return;
    }
    let c = Cluster::start();
    let eve = user("whfr-fifo2");
    let dir = scratch("wharf-sif-fifo-");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sif = fifo_identity_sif(dir.path(), &eve);
    let id = submitted_id(&c.wharf_as(
        &eve,
        &[
            "submit",
            "--image",
            sif.to_str().unwrap(),
            "--wrap",
            "sleep 300",
        ],
    ));
    // Long enough for the launch to reach the identity files; the old code was still there.
    std::thread::sleep(Duration::from_secs(3));
    let cancel = c.wharf_as(&eve, &["cancel", &id.to_string()]);
    assert!(cancel.status.success(), "{}", stderr(&cancel));
    let cancelled = std::time::Instant::now();
    let job = c.wait_done(id, Duration::from_secs(30));
    assert_eq!(job["state"], "CANCELLED", "{job}");
    assert!(
        cancelled.elapsed() < Duration::from_secs(15),
        "ended {:?} after the cancel: {job}",
        cancelled.elapsed()
    );
}
