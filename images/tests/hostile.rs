//! Hostile archives: nothing may be written outside the image, and a refused import leaves
//! the store as it was.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;

use common::{find_named, scratch, scratch_with, Layout, Tar, LAYER_TAR};
use tar::EntryType;
use wharf_images::{ErrorKind, Limits};

#[test]
fn traversal_is_refused_and_absolute_paths_stay_inside() {
    let s = scratch();
    for raw in ["../../etc/x", "./../x", "a/../../x"] {
        let tar = s.put(
            "t.tar",
            &Tar::new().file("ok", b"ok").file(raw, b"evil").bytes(),
        );
        let err = s.store.import(&tar, "trav").unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidInput, "{raw}");
        assert!(err.message.contains(".."), "{err}");
        assert!(
            find_named(&s.base, "x").is_empty(),
            "{raw} was written somewhere"
        );
    }
    assert!(s.store.list().unwrap().is_empty());
    s.assert_no_leftovers();

    let target = s.outside.join("abs");
    let tar = Tar::new()
        .file(target.to_str().unwrap(), b"inside")
        .file("/etc/y", b"y")
        .bytes();
    let info = s.store.import(&s.put("abs.tar", &tar), "abs").unwrap();
    let inside = info.rootfs.join(target.strip_prefix("/").unwrap());
    assert_eq!(fs::read(inside).unwrap(), b"inside");
    assert_eq!(fs::read(info.rootfs.join("etc/y")).unwrap(), b"y");
    s.assert_outside_untouched();
}

#[test]
fn symlink_then_write_through_it_stays_inside() {
    let s = scratch();
    let out = s.outside.to_str().unwrap().to_string();

    // A directory symlink to the host, then a file under it.
    let tar = Tar::new()
        .symlink("a", &out)
        .file("a/evil", b"evil")
        .bytes();
    let err = s.store.import(&s.put("1.tar", &tar), "sym1").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    s.assert_outside_untouched();
    s.assert_no_leftovers();

    // The same, relative and climbing: RESOLVE_IN_ROOT pins `..` at the image root.
    let tar = Tar::new()
        .symlink("b", "../../../../../../../../..")
        .file("b/evil2", b"x")
        .bytes();
    let info = s.store.import(&s.put("2.tar", &tar), "sym2").unwrap();
    assert_eq!(fs::read(info.rootfs.join("evil2")).unwrap(), b"x");
    assert!(find_named(&s.base, "evil2").len() == 1);

    // A file symlink to the host, then a regular file of the same name: the link is replaced.
    let victim = s.outside.join("victim");
    let tar = Tar::new()
        .symlink("f", victim.to_str().unwrap())
        .file("f", b"replaced")
        .bytes();
    let info = s.store.import(&s.put("3.tar", &tar), "sym3").unwrap();
    assert!(fs::symlink_metadata(info.rootfs.join("f"))
        .unwrap()
        .is_file());
    assert_eq!(fs::read(info.rootfs.join("f")).unwrap(), b"replaced");
    assert!(!victim.exists());

    // Across layers: the lower layer plants the link, the upper one writes through it.
    let layout = Layout::new(s.work.join("layout"));
    let lower = Tar::new()
        .symlink("etc", &out)
        .symlink("etc2", &out)
        .bytes();
    let upper = Tar::new()
        .file("etc2", b"file over link")
        .file("etc/passwd", b"root::0:0")
        .bytes();
    layout.index(vec![
        layout.manifest(&[(LAYER_TAR, lower), (LAYER_TAR, upper)])
    ]);
    let err = s.store.import(&layout.dir, "layers").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    s.assert_outside_untouched();
    assert_eq!(s.store.list().unwrap().len(), 2, "only sym2 and sym3");
    s.assert_no_leftovers();
}

#[test]
fn hardlinks_outside_are_refused() {
    let s = scratch();
    let secret = s.base.join("secret");
    fs::write(&secret, b"secret").unwrap();
    fs::create_dir(s.outside.join("d")).unwrap();
    fs::write(s.outside.join("d/secret2"), b"secret").unwrap();

    let cases = [
        Tar::new().hardlink("h", "../../../../secret").bytes(),
        Tar::new().hardlink("h", secret.to_str().unwrap()).bytes(),
        Tar::new()
            .symlink("s", s.outside.to_str().unwrap())
            .hardlink("h", "s/d/secret2")
            .bytes(),
        Tar::new().dir("d/").hardlink("h", "d").bytes(),
    ];
    for (i, tar) in cases.iter().enumerate() {
        let err = s.store.import(&s.put("h.tar", tar), "hard").unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidInput, "case {i}: {err}");
        assert!(err.message.contains("hard link"), "case {i}: {err}");
    }
    assert_eq!(fs::metadata(&secret).unwrap().nlink(), 1);
    assert_eq!(
        fs::metadata(s.outside.join("d/secret2")).unwrap().nlink(),
        1
    );
    assert!(s.store.list().unwrap().is_empty());
    s.assert_no_leftovers();
}

#[test]
fn devices_and_fifos_are_skipped() {
    let s = scratch();
    let tar = Tar::new()
        .raw(EntryType::Char, b"dev/mem", b"", b"", 0o666)
        .raw(EntryType::Block, b"dev/sda", b"", b"", 0o660)
        .raw(EntryType::Fifo, b"run/fifo", b"", b"", 0o644)
        .file("kept", b"k")
        .bytes();
    let info = s.store.import(&s.put("dev.tar", &tar), "dev").unwrap();
    assert!(!info.rootfs.join("dev/mem").exists());
    assert!(!info.rootfs.join("dev/sda").exists());
    assert!(fs::symlink_metadata(info.rootfs.join("run/fifo")).is_err());
    assert!(info.rootfs.join("kept").exists());
    s.assert_no_leftovers();
}

#[test]
fn empty_link_and_overlong_paths_are_refused() {
    let s = scratch();
    let tar = Tar::new()
        .raw(EntryType::Symlink, b"l", b"", b"", 0o777)
        .bytes();
    assert_eq!(
        s.store.import(&s.put("a.tar", &tar), "x").unwrap_err().kind,
        ErrorKind::InvalidInput
    );
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_entry_type(EntryType::Regular);
    let deep = "d/".repeat(300) + "f";
    b.append_data(&mut h, &deep, &b"x"[..]).unwrap();
    let err = s
        .store
        .import(&s.put("b.tar", &b.into_inner().unwrap()), "x")
        .unwrap_err();
    assert!(err.message.contains("deeper"), "{err}");
    s.assert_no_leftovers();
}

#[test]
fn limits_are_enforced_and_leave_nothing() {
    let limits = Limits {
        max_entries: 3,
        max_unpacked_bytes: 10,
        ..Limits::default()
    };
    let s = scratch_with(limits);
    let many = Tar::new()
        .file("1", b"")
        .file("2", b"")
        .file("3", b"")
        .file("4", b"")
        .bytes();
    let err = s.store.import(&s.put("many.tar", &many), "x").unwrap_err();
    assert!(err.message.contains("entries"), "{err}");
    let big = Tar::new().file("big", &[7u8; 11]).bytes();
    let err = s.store.import(&s.put("big.tar", &big), "x").unwrap_err();
    assert!(err.message.contains("bytes"), "{err}");
    let fits = Tar::new().file("ok", &[7u8; 10]).bytes();
    s.store.import(&s.put("ok.tar", &fits), "x").unwrap();

    // A gzip bomb: small compressed, huge uncompressed, stopped by the stream cap.
    let bomb = common::gzip(&vec![0u8; 1 << 20]);
    let err = s
        .store
        .import(&s.put("bomb.tar.gz", &bomb), "y")
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert_eq!(s.store.list().unwrap().len(), 1);
    s.assert_no_leftovers();
}
