//! Importing OCI image layouts: layers, whiteouts, tags, platforms, verification.

mod common;

use std::fs;

use common::{
    for_platform, gzip, scratch, tagged, zstd, Layout, Tar, LAYER_GZIP, LAYER_TAR, LAYER_ZSTD,
};
use wharf_images::ErrorKind;

/// Layer 1 lays out files; layer 2 whites some out, makes `b` opaque and adds to it.
fn two_layers() -> (Vec<u8>, Vec<u8>) {
    let lower = Tar::new()
        .dir("a/")
        .file("a/keep", b"keep")
        .file("a/gone", b"gone")
        .dir("a/gonedir/")
        .file("a/gonedir/deep", b"deep")
        .dir("b/")
        .file("b/old1", b"old")
        .dir("b/sub/")
        .file("b/sub/old2", b"old")
        .file("c", b"lower c")
        .bytes();
    let upper = Tar::new()
        // An entry of this layer listed before the opaque marker must survive it.
        .file("b/sub/new-before", b"new")
        .file("b/.wh..wh..opq", b"")
        .file("b/new-after", b"new")
        .file("a/.wh.gone", b"")
        .file("a/.wh.gonedir", b"")
        .file(".wh.nonexistent", b"")
        .file("c", b"upper c")
        .bytes();
    (lower, upper)
}

#[test]
fn two_layers_with_whiteouts() {
    let s = scratch();
    let layout = Layout::new(s.work.join("layout"));
    let (lower, upper) = two_layers();
    let manifest = layout.manifest(&[(LAYER_GZIP, gzip(&lower)), (LAYER_ZSTD, zstd(&upper))]);
    let digest = manifest["digest"].as_str().unwrap().to_string();
    layout.index(vec![tagged(manifest, "v1")]);

    let info = s.store.import(&layout.dir, "layered").unwrap();
    assert_eq!(info.source, "oci-layout");
    assert_eq!(
        info.digest, digest,
        "an OCI image is named by its manifest digest"
    );
    let r = &info.rootfs;
    assert_eq!(fs::read(r.join("a/keep")).unwrap(), b"keep");
    assert!(!r.join("a/gone").exists());
    assert!(!r.join("a/gonedir").exists());
    assert!(
        !r.join("b/old1").exists(),
        "opaque directory hides lower content"
    );
    assert!(!r.join("b/sub/old2").exists(), "even in subdirectories");
    assert_eq!(fs::read(r.join("b/sub/new-before")).unwrap(), b"new");
    assert_eq!(fs::read(r.join("b/new-after")).unwrap(), b"new");
    assert_eq!(fs::read(r.join("c")).unwrap(), b"upper c");
    assert!(common::find_named(r, ".wh..wh..opq").is_empty());
    assert!(common::find_named(r, ".wh.gone").is_empty());
    assert!(r.join("proc").is_dir());
    s.assert_no_leftovers();
}

#[test]
fn tag_and_platform_selection() {
    let s = scratch();
    let layout = Layout::new(s.work.join("layout"));
    let v1 = layout.manifest(&[(LAYER_TAR, Tar::new().file("version", b"1").bytes())]);
    let host = layout.manifest(&[(LAYER_TAR, Tar::new().file("version", b"2-host").bytes())]);
    let other = layout.manifest(&[(LAYER_TAR, Tar::new().file("version", b"2-other").bytes())]);
    let host_arch = if cfg!(target_arch = "aarch64") {
        "arm64"
    } else {
        "amd64"
    };
    let multi = layout.nested_index(vec![
        for_platform(other, "linux", "s390x"),
        for_platform(host.clone(), "linux", host_arch),
    ]);
    layout.index(vec![tagged(v1, "v1"), tagged(multi, "v2")]);

    let read = |name: &str| fs::read(s.store.get(name).unwrap().rootfs.join("version")).unwrap();
    let dir = layout.dir.display();
    s.store.import(format!("{dir}:v1").as_ref(), "v1").unwrap();
    assert_eq!(read("v1"), b"1");
    let info = s.store.import(format!("{dir}:v2").as_ref(), "v2").unwrap();
    assert_eq!(read("v2"), b"2-host");
    assert_eq!(info.digest, host["digest"].as_str().unwrap());
    s.store.import(&layout.dir, "first").unwrap();
    assert_eq!(read("first"), b"1", "no tag: the first manifest");

    let err = s
        .store
        .import(format!("{dir}:v3").as_ref(), "v3")
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::NotFound);
    assert!(
        err.message.contains("v1") && err.message.contains("v2"),
        "{err}"
    );
    s.assert_no_leftovers();
}

#[test]
fn digest_mismatch_is_rejected_and_store_unchanged() {
    let s = scratch();
    let layout = Layout::new(s.work.join("layout"));
    let good = Tar::new().file("data", b"good").bytes();
    let manifest = layout.manifest(&[(LAYER_TAR, good.clone())]);
    layout.index(vec![manifest]);
    let before = s.store.import(&layout.dir, "img").unwrap();

    // Same size, different content: only the digest can tell.
    let blob = layout.blob_path(&common::sha256(&good));
    let mut bad = good.clone();
    let at = bad.windows(4).position(|w| w == b"good").unwrap();
    bad[at..at + 4].copy_from_slice(b"evil");
    fs::write(&blob, &bad).unwrap();
    let err = s.store.import(&layout.dir, "img").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("digest"), "{err}");
    assert_eq!(s.store.get("img").unwrap(), before, "old image kept");
    assert_eq!(fs::read(before.rootfs.join("data")).unwrap(), b"good");
    s.assert_no_leftovers();

    // A tampered manifest is caught too.
    fs::write(&blob, &good).unwrap();
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.dir.join("index.json")).unwrap()).unwrap();
    let manifest_blob = layout.blob_path(index["manifests"][0]["digest"].as_str().unwrap());
    let mut m = fs::read(&manifest_blob).unwrap();
    let last = m.len() - 1;
    m[last] = b' ';
    fs::write(&manifest_blob, &m).unwrap();
    assert_eq!(
        s.store.import(&layout.dir, "img").unwrap_err().kind,
        ErrorKind::InvalidInput
    );
    assert_eq!(s.store.list().unwrap(), vec![before]);
    s.assert_no_leftovers();
}

#[test]
fn unsupported_layers_and_malformed_layouts() {
    let s = scratch();
    let layout = Layout::new(s.work.join("layout"));
    let tar = Tar::new().file("x", b"x").bytes();
    let manifest = layout.manifest(&[("application/vnd.oci.image.layer.v1.tar+bzip2", tar)]);
    layout.index(vec![manifest]);
    let err = s.store.import(&layout.dir, "img").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput);
    assert!(err.message.contains("media type"), "{err}");

    layout.index(vec![]);
    assert_eq!(
        s.store.import(&layout.dir, "img").unwrap_err().kind,
        ErrorKind::InvalidInput
    );

    fs::write(layout.dir.join("index.json"), b"{ not json").unwrap();
    assert_eq!(
        s.store.import(&layout.dir, "img").unwrap_err().kind,
        ErrorKind::InvalidInput
    );

    fs::write(layout.dir.join("index.json"), vec![b' '; 5 << 20]).unwrap();
    let err = s.store.import(&layout.dir, "img").unwrap_err();
    assert!(err.message.contains("larger"), "{err}");

    let bad_digest = serde_json::json!({
        "mediaType": common::MANIFEST, "digest": "sha256:../../../etc/passwd", "size": 1
    });
    layout.index(vec![bad_digest]);
    let err = s.store.import(&layout.dir, "img").unwrap_err();
    assert!(err.message.contains("malformed"), "{err}");
    assert!(s.store.list().unwrap().is_empty());
    s.assert_no_leftovers();
}

#[test]
fn layer_count_limit() {
    let limits = wharf_images::Limits {
        max_layers: 1,
        ..wharf_images::Limits::default()
    };
    let s = common::scratch_with(limits);
    let layout = Layout::new(s.work.join("layout"));
    let tar = Tar::new().file("x", b"x").bytes();
    layout.index(vec![
        layout.manifest(&[(LAYER_TAR, tar.clone()), (LAYER_TAR, tar)])
    ]);
    let err = s.store.import(&layout.dir, "img").unwrap_err();
    assert!(err.message.contains("layers"), "{err}");
    s.assert_no_leftovers();
}
