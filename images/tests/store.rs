//! The store's own directories are private to its owner whatever the umask, so a file that is
//! setuid root in an image cannot be run, opened or even looked at by another host user.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

use common::{scratch, Tar};
use nix::sys::stat::{umask, Mode};
use wharf_images::ImageStore;

/// The umask is the process's: the tests here that create directories take turns.
static UMASK: Mutex<()> = Mutex::new(());

/// Returns false (after printing why) when the test cannot run here; panics instead under
/// WHARF_TEST_STRICT=1.
fn can_run(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    let why = format!("{test}: needs root (setuid-root files, useradd)");
    assert!(
        std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
        "{why}"
    );
    eprintln!("SKIPPED {why}");
    false
}

/// A real unprivileged host user, created once: `(uid, gid)`.
fn host_user(name: &str) -> (u32, u32) {
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let out = Command::new("useradd")
            .args(["--no-create-home", "--shell", "/bin/sh", name])
            .output()
            .expect("useradd");
        assert!(
            out.status.success() || String::from_utf8_lossy(&out.stderr).contains("already exists"),
            "useradd {name}: {out:?}"
        );
    }
    let u = nix::unistd::User::from_name(name).unwrap().unwrap();
    (u.uid.as_raw(), u.gid.as_raw())
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// The store's own directories: root, `images/`, `tmp/` and each image's directory.
fn store_dirs(store: &ImageStore) -> Vec<std::path::PathBuf> {
    let root = store.root().to_path_buf();
    let mut dirs = vec![root.clone(), root.join("images"), root.join("tmp")];
    for e in fs::read_dir(root.join("images")).unwrap() {
        dirs.push(e.unwrap().path());
    }
    dirs
}

#[test]
fn setuid_root_file_in_an_image_is_unreachable_by_other_users() {
    if !can_run("setuid_root_file_in_an_image_is_unreachable_by_other_users") {
        return;
    }
    let _umask = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    let (uid, gid) = host_user("whimg-store");
    let s = scratch();
    // A store where nodes keep theirs: under directories every user may enter.
    fs::set_permissions(&s.base, fs::Permissions::from_mode(0o755)).unwrap();
    // A real program, setuid root: on a store others can walk it runs as root for them.
    let id = fs::read("/usr/bin/id").unwrap();
    let tar = Tar::new()
        .dir("usr/")
        .dir("usr/bin/")
        .file_owned("usr/bin/rootid", &id, 0o4755, 0, 0)
        .bytes();
    let info = s.store.import(&s.put("suid.tar", &tar), "suid").unwrap();
    let suid = info.rootfs.join("usr/bin/rootid");
    let meta = fs::metadata(&suid).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.uid()), (0o4755, 0));

    let as_user = |cmd: &mut Command| cmd.uid(uid).gid(gid).output();
    match as_user(&mut Command::new(&suid)) {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EACCES), "exec: {e}"),
        Ok(out) => panic!(
            "uid {uid} ran the image's setuid-root file on the host: {}",
            String::from_utf8_lossy(&out.stdout)
        ),
    }
    for tool in [&["stat", "--"][..], &["head", "-c1", "--"][..]] {
        let out = as_user(Command::new(tool[0]).args(&tool[1..]).arg(&suid)).unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("Permission denied"),
            "{} as uid {uid}: {out:?}",
            tool[0]
        );
    }
    for dir in store_dirs(&s.store) {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        let out = as_user(Command::new("ls").arg(&dir)).unwrap();
        assert!(!out.status.success(), "uid {uid} listed {}", dir.display());
    }
    // Root, as `wharf image ls` and the agent, still sees it all.
    assert_eq!(s.store.list().unwrap(), vec![info.clone()]);
    assert_eq!(s.store.get("suid").unwrap(), info);
    let out = Command::new(&suid).arg("-u").output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
}

#[test]
fn store_is_private_whatever_the_umask_and_old_stores_are_fixed() {
    let _umask = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let tar = Tar::new().file("f", b"x").bytes();
    let src = tmp.path().join("t.tar");
    fs::write(&src, &tar).unwrap();
    for (i, mask) in [0o000, 0o022, 0o277].into_iter().enumerate() {
        let old = umask(Mode::from_bits_truncate(mask));
        let opened = ImageStore::open(tmp.path().join(format!("store{i}")));
        let imported = opened.as_ref().map(|s| s.import(&src, "img").map(drop));
        umask(old);
        imported.unwrap().unwrap();
        let store = opened.unwrap();
        for dir in store_dirs(&store) {
            assert_eq!(mode(&dir), 0o700, "umask {mask:03o}: {}", dir.display());
        }
    }

    // A store made by an older version: everything 0755.
    let root = tmp.path().join("store1");
    let store = ImageStore::open(root.clone()).unwrap();
    for dir in store_dirs(&store) {
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let store = ImageStore::open(root).unwrap();
    for dir in store_dirs(&store) {
        assert_eq!(mode(&dir), 0o700, "not fixed: {}", dir.display());
    }
    assert_eq!(store.list().unwrap().len(), 1);
    // Inside the image, modes are the image's own.
    let rootfs = store.get("img").unwrap().rootfs;
    assert_eq!(mode(&rootfs.join("f")), 0o644);
    assert_eq!(mode(&rootfs.join("tmp")), 0o1777);
}

/// `wharf image import` may run before the agent ever started: the directories it makes above
/// the store (`/var/lib/wharf`) are shared with the agent's job roots, which jobs must pass
/// through, so only the store itself is private.
#[test]
fn missing_parents_of_the_store_are_0755_and_only_the_store_is_private() {
    let _umask = UMASK.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    for mask in [0o022, 0o077] {
        let top = tmp.path().join(format!("var{mask:o}"));
        let root = top.join("lib/wharf/images");
        let old = umask(Mode::from_bits_truncate(mask));
        let opened = ImageStore::open(root.clone());
        umask(old);
        let store = opened.unwrap();
        for dir in [&top, &top.join("lib"), &top.join("lib/wharf")] {
            assert_eq!(mode(dir), 0o755, "umask {mask:03o}: {}", dir.display());
        }
        for dir in store_dirs(&store) {
            assert_eq!(mode(&dir), 0o700, "umask {mask:03o}: {}", dir.display());
        }
    }
    // An existing parent keeps the mode its owner gave it.
    let mine = tmp.path().join("mine");
    fs::create_dir(&mine).unwrap();
    fs::set_permissions(&mine, fs::Permissions::from_mode(0o750)).unwrap();
    ImageStore::open(mine.join("store")).unwrap();
    assert_eq!(mode(&mine), 0o750);
}

/// The inode flags of `dir` (`FS_IOC_GETFLAGS`), or the error of a filesystem without them.
fn inode_flags(dir: &Path) -> nix::Result<libc::c_int> {
    use std::os::fd::AsRawFd;
    let dir = fs::File::open(dir).unwrap();
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int through the pointer, which outlives the call.
    let res = unsafe { libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) };
    nix::errno::Errno::result(res).map(|_| flags)
}

#[test]
fn new_trees_in_the_stores_tmp_are_spread_over_the_filesystem_on_ext4() {
    const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    let store = ImageStore::open(root.clone()).unwrap();
    let ext = nix::sys::statfs::statfs(tmp.path())
        .unwrap()
        .filesystem_type()
        == nix::sys::statfs::EXT4_SUPER_MAGIC;
    let flags = inode_flags(&root.join("tmp"));
    if ext {
        // ext2/3/4: the hint is taken, and kept by the next open.
        assert_ne!(
            flags.unwrap() & FS_TOPDIR_FL,
            0,
            "tmp/ lacks the Orlov hint"
        );
        drop(store);
        ImageStore::open(root.clone()).unwrap();
        assert_ne!(inode_flags(&root.join("tmp")).unwrap() & FS_TOPDIR_FL, 0);
    } else {
        // Elsewhere the hint is refused, which must not keep the store from opening.
        assert_eq!(flags.map(|f| f & FS_TOPDIR_FL).unwrap_or(0), 0);
    }
    // Only tmp/: the published layers, roots and images stay where they are.
    for sub in ["layers", "roots", "images"] {
        let f = inode_flags(&root.join(sub)).unwrap_or(0);
        assert_eq!(f & FS_TOPDIR_FL, 0, "{sub}");
    }
}
