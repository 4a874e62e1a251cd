//! The node's image store: private to root, so an image's setuid-root files cannot be run on
//! the host by other users, while jobs still run the image through their overlay.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::harness::*;

#[test]
fn image_store_is_private_to_root_yet_jobs_run_its_images() {
    if !can_run("image_store_is_private_to_root_yet_jobs_run_its_images") {
        return;
    }
    let c = Cluster::start();
    let rootfs = c.dir.join("suid-rootfs");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mkrootfs.sh");
    assert!(std::process::Command::new(script)
        .arg(&rootfs)
        .args(["sh", "id", "stat"])
        .status()
        .unwrap()
        .success());
    // A root-owned setuid copy of `id`: run on the host from the store, it would say euid=0.
    let suid = rootfs.join("bin/suid-id");
    std::fs::copy(rootfs.join("usr/bin/id"), &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    c.import(&rootfs, "suid");

    let store = c.dir.join("images");
    let image = wharf_images::ImageStore::open(store.clone())
        .unwrap()
        .get("suid")
        .unwrap();
    let stored = image.rootfs.join("bin/suid-id");
    let meta = std::fs::metadata(&stored).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o4755, 0));
    assert_eq!(
        std::fs::metadata(&store).unwrap().mode() & 0o7777,
        0o700,
        "the store the agent and `wharf image` made"
    );

    let eve = user("whimg-eve");
    let home = c.home(&eve);
    let path = stored.to_str().unwrap();
    // Through a shell: setpriv itself still holds root's capabilities when it execs.
    for (exe, args) in [
        ("sh", vec!["-c", "exec \"$0\"", path]),
        ("stat", vec!["--", path]),
        ("head", vec!["-c1", "--", path]),
    ] {
        let out = as_user(&eve, &home, exe, &args, &c.socket);
        assert!(
            !out.status.success() && stderr(&out).contains("Permission denied"),
            "{exe} {args:?} as {}: {}{}",
            eve.name,
            stdout(&out),
            stderr(&out)
        );
    }
    // Root lists the store; another user is told it is root's.
    let store_arg = store.to_str().unwrap();
    let out = c.wharf(&["image", "ls", "--store", store_arg]);
    assert!(
        out.status.success() && stdout(&out).contains("suid"),
        "{out:?}"
    );
    let out = c.wharf_as(&eve, &["image", "ls", "--store", store_arg]);
    assert!(
        !out.status.success() && stderr(&out).contains("private"),
        "{}",
        stderr(&out)
    );

    // The job sees the image through its overlay, and the setuid bit gives it nothing.
    let out = c.run_sh(
        &eve,
        &["--image", "suid"],
        "suid-id -u; stat -c %a /bin/suid-id",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).lines().collect::<Vec<_>>(),
        [eve.uid.to_string().as_str(), "4755"]
    );
}

#[test]
fn import_limits_are_set_on_the_command_line() {
    if !can_run("import_limits_are_set_on_the_command_line") {
        return;
    }
    let dir = scratch("whimg-limits-");
    let rootfs = dir.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("data")).unwrap();
    std::fs::write(rootfs.join("data/big"), vec![7u8; 4096]).unwrap();
    let store = dir.path().join("store");
    let import = |extra: &[&str]| {
        std::process::Command::new(wharf_bin())
            .args(["image", "import"])
            .arg(&rootfs)
            .args(["--name", "img", "--store"])
            .arg(&store)
            .args(extra)
            .output()
            .unwrap()
    };
    for (flag, value, expect) in [
        ("--max-file", "1K", "per file"),
        ("--max-unpacked", "2K", "per image"),
        ("--max-entries", "1", "entries"),
    ] {
        let out = import(&[flag, value]);
        assert!(!out.status.success(), "{flag} {value} accepted");
        let err = stderr(&out);
        assert!(err.contains(expect) && err.contains(flag), "{err}");
    }
    let out = import(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
}
