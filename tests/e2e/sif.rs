//! Apptainer SIF images: the primary partition mounted read-only at its offset, in the same
//! sandbox; corrupt, hostile or unreadable files refused with the reason.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::harness::*;

fn tools_present() -> bool {
    let ok = ["siftool", "mksquashfs"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !ok {
        let why = "SIF tests need siftool and mksquashfs (apt-get install siftool squashfs-tools)";
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
    }
    ok
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes `dir/NAME.sif` from a small rootfs with a marker file.
fn make_sif(dir: &Path, name: &str) -> PathBuf {
    let root = dir.join(format!("{name}-root"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mkrootfs.sh");
    run(Command::new(script)
        .arg(&root)
        .args(["sh", "cat", "id", "ls"]));
    std::fs::write(root.join("etc/marker"), format!("inside {name}\n")).unwrap();
    let sif = dir.join(format!("{name}.sif"));
    run(
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mksif.sh"))
            .arg(&root)
            .arg(&sif),
    );
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
    if !can_run("sif_image_runs_in_the_sandbox_and_leaves_no_loop_device") || !tools_present() {
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
    if !can_run("corrupt_or_unreadable_sif_files_are_refused_with_the_reason") || !tools_present() {
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
