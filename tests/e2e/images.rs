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

/// A user who may not make the store is told whose it is and what to do, and a listing of a
/// store that does not exist makes nothing: before, `wharf image ls` as a user failed with
/// "creating /var/lib/wharf: Permission denied", having tried to create it.
#[test]
fn a_store_a_user_may_not_make_is_explained_and_not_made_to_list_it() {
    if !can_run("a_store_a_user_may_not_make_is_explained_and_not_made_to_list_it") {
        return;
    }
    let dir = scratch("whimg-nostore-");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let eve = user("whimg-eve");
    let socket = dir.path().join("none.sock");
    let wharf = |args: &[&str]| as_user(&eve, dir.path(), wharf_bin(), args, &socket);
    // Below a missing directory (as /var/lib/wharf on a node whose agent never ran), and
    // directly in root's directory.
    for store in [
        dir.path().join("lib/wharf/images"),
        dir.path().join("images"),
    ] {
        let store_arg = store.to_str().unwrap();
        for args in [vec!["image", "ls"], vec!["image", "ls", "--json"]] {
            let out = wharf(&[&args[..], &["--store", store_arg]].concat());
            assert!(out.status.success(), "{args:?}: {}", stderr(&out));
            assert!(
                stderr(&out).contains(&format!("no image store at {store_arg} yet")),
                "{}",
                stderr(&out)
            );
        }
        let out = wharf(&["image", "inspect", "x", "--store", store_arg]);
        assert!(
            !out.status.success() && stderr(&out).contains("not in the store"),
            "{}",
            stderr(&out)
        );
        let out = wharf(&["image", "import", "/", "--name", "x", "--store", store_arg]);
        let err = stderr(&out);
        assert!(
            !out.status.success()
                && err.contains(&format!("no image store at {store_arg}"))
                && err.contains("as root (with sudo) on the node"),
            "{err}"
        );
        assert!(!store.exists());
    }
    assert!(!dir.path().join("lib").exists(), "made to list a store");
}
