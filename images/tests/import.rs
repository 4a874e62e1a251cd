//! Importing tarballs and directories; listing, getting, replacing and removing images.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{gzip, scratch, sha256, zstd, Tar};
use wharf_images::{validate_name, ErrorKind};

fn sample() -> Vec<u8> {
    Tar::new()
        .dir("./")
        .dir("./usr/")
        .dir("./usr/bin/")
        .file("./usr/bin/tool", b"#!/bin/sh\necho hi\n")
        .file_owned("./usr/bin/suid", b"x", 0o4755, 1234, 5678)
        .symlink("./bin", "usr/bin")
        .hardlink("./usr/bin/tool2", "./usr/bin/tool")
        .file("etc/hostname", b"box\n")
        .bytes()
}

fn assert_sample(rootfs: &Path) {
    assert_eq!(
        fs::read(rootfs.join("usr/bin/tool")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        fs::read_link(rootfs.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    let tool = fs::metadata(rootfs.join("usr/bin/tool")).unwrap();
    let tool2 = fs::metadata(rootfs.join("usr/bin/tool2")).unwrap();
    assert_eq!(tool.ino(), tool2.ino(), "hard link");
    assert_eq!(tool.mode() & 0o7777, 0o644);
    assert_eq!(tool.mtime(), 1_700_000_000);
    let suid = fs::metadata(rootfs.join("usr/bin/suid")).unwrap();
    assert_eq!(suid.mode() & 0o7777, 0o4755, "setuid bit kept");
    if nix::unistd::geteuid().is_root() {
        assert_eq!((suid.uid(), suid.gid()), (1234, 5678));
    }
    assert_eq!(fs::read(rootfs.join("etc/hostname")).unwrap(), b"box\n");
    for (dir, mode) in [
        ("proc", 0o755),
        ("sys", 0o755),
        ("dev", 0o755),
        ("tmp", 0o1777),
        ("etc", 0o755),
    ] {
        let m = fs::symlink_metadata(rootfs.join(dir)).unwrap();
        assert!(m.is_dir(), "{dir}");
        if dir != "etc" {
            assert_eq!(m.permissions().mode() & 0o7777, mode, "{dir}");
        }
    }
}

#[test]
fn tarball_plain_gzip_and_zstd() {
    let s = scratch();
    let tar = sample();
    // Extensions lie on purpose: the magic bytes decide.
    let sources = [
        ("plain.tar.gz", tar.clone()),
        ("gz.tar", gzip(&tar)),
        ("zst.tgz", zstd(&tar)),
    ];
    for (i, (file, bytes)) in sources.iter().enumerate() {
        let name = format!("img{i}");
        let info = s.store.import(&s.put(file, bytes), &name).unwrap();
        assert_eq!(info.name, name);
        assert_eq!(info.source, "tarball");
        assert_eq!(
            info.digest,
            sha256(&tar),
            "digest of the uncompressed stream"
        );
        assert_eq!(info.size, 18 + 1 + 4, "hard link counted once");
        assert!(info.created_ms > 0);
        assert_eq!(s.store.get(&name).unwrap(), info);
        assert_sample(&info.rootfs);
    }
    s.assert_no_leftovers();
}

#[test]
fn directory_import_matches_and_is_deterministic() {
    let s = scratch();
    let src = s.work.join("tree");
    fs::create_dir_all(src.join("usr/bin")).unwrap();
    fs::write(src.join("usr/bin/tool"), b"tool").unwrap();
    fs::set_permissions(src.join("usr/bin/tool"), fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", src.join("shadow-link")).unwrap();
    std::os::unix::fs::symlink("usr/bin", src.join("bin")).unwrap();
    fs::create_dir(src.join("proc")).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();

    let info = s.store.import(&src, "tree").unwrap();
    assert_eq!(info.source, "directory");
    assert_eq!(fs::read(info.rootfs.join("usr/bin/tool")).unwrap(), b"tool");
    let mode = fs::metadata(info.rootfs.join("usr/bin/tool"))
        .unwrap()
        .mode()
        & 0o7777;
    assert_eq!(mode, 0o750);
    // Symlinks are copied as links, never followed on the host.
    assert_eq!(
        fs::read_link(info.rootfs.join("shadow-link")).unwrap(),
        Path::new("/etc/shadow")
    );
    assert!(!info.rootfs.join("sock").exists(), "sockets are skipped");
    assert!(info.rootfs.join("tmp").is_dir());

    let again = s.store.import(&src, "tree2").unwrap();
    assert_eq!(again.digest, info.digest, "same tree, same digest");
    s.assert_no_leftovers();
}

#[test]
fn list_get_replace_and_remove() {
    let s = scratch();
    let a = s.put("a.tar", &Tar::new().file("a", b"1").bytes());
    let b = s.put("b.tar", &Tar::new().file("b", b"22").bytes());
    s.store.import(&b, "zeta:1").unwrap();
    s.store.import(&a, "alpha/x:1").unwrap();
    let names: Vec<_> = s
        .store
        .list()
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["alpha/x:1", "zeta:1"]);
    assert_eq!(s.store.names().unwrap(), names);

    // Replacing swaps the whole image.
    let replaced = s.store.import(&b, "alpha/x:1").unwrap();
    assert!(replaced.rootfs.join("b").exists());
    assert!(!replaced.rootfs.join("a").exists());
    assert_eq!(s.store.list().unwrap().len(), 2);

    s.store.remove("zeta:1").unwrap();
    assert_eq!(
        s.store.remove("zeta:1").unwrap_err().kind,
        ErrorKind::NotFound
    );
    let err = s.store.get("zeta:1").unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound);
    assert!(err.to_string().contains("import"), "{err}");
    assert_eq!(s.store.list().unwrap().len(), 1);
    // The cheap listing sees the removal too, and a later import.
    assert_eq!(s.store.names().unwrap(), ["alpha/x:1"]);
    s.store.import(&a, "beta:2").unwrap();
    assert_eq!(s.store.names().unwrap(), ["alpha/x:1", "beta:2"]);
    s.store.remove("beta:2").unwrap();
    s.assert_no_leftovers();

    // The store reopens with what it had.
    let reopened = wharf_images::ImageStore::open(s.store.root().to_path_buf()).unwrap();
    assert_eq!(reopened.get("alpha/x:1").unwrap(), replaced);
}

#[test]
fn bad_names_and_sources_are_rejected() {
    let s = scratch();
    let tar = s.put("a.tar", &Tar::new().file("a", b"1").bytes());
    for name in ["", "host", "a b", "../x", "a/./b", &"n".repeat(256)] {
        let err = s.store.import(&tar, name).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidInput, "{name:?}");
        assert!(validate_name(name).is_err());
        assert_eq!(s.store.get(name).unwrap_err().kind, ErrorKind::InvalidInput);
    }
    let err = s
        .store
        .import(&s.work.join("missing.tar"), "x")
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound);
    let err = s
        .store
        .import(&s.put("junk.tar", b"not a tarball at all"), "x")
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    let err = s
        .store
        .import(&s.put("x.tar.xz", b"\xfd7zXZ\0rest"), "x")
        .unwrap_err();
    assert!(err.message.contains("xz"), "{err}");
    assert!(s.store.list().unwrap().is_empty());
    s.assert_no_leftovers();
}

#[test]
fn an_imported_image_a_job_uses_is_not_replaced_under_it() {
    let s = scratch();
    let v1 = Tar::new().dir("etc/").file("etc/v", b"one\n").bytes();
    let v2 = Tar::new().dir("etc/").file("etc/v", b"two\n").bytes();
    let first = s.store.import(&s.put("v1.tar", &v1), "app").unwrap();
    let pin = wharf_images::Pin::rootfs(&first.rootfs).unwrap();

    // While a job holds it: refused, saying why, and the job's root is untouched.
    let err = s.store.import(&s.put("v2.tar", &v2), "app").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("in use by a running job"), "{err}");
    assert_eq!(fs::read(first.rootfs.join("etc/v")).unwrap(), b"one\n");
    assert_eq!(s.store.get("app").unwrap().digest, first.digest);

    // Once it lets go: replaced.
    drop(pin);
    let second = s.store.import(&s.put("v2.tar", &v2), "app").unwrap();
    assert_eq!(fs::read(second.rootfs.join("etc/v")).unwrap(), b"two\n");
    assert_ne!(second.digest, first.digest);
}
