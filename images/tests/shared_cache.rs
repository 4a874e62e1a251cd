//! The cluster-wide layer cache (`[images] shared_cache`): two node stores over one cache
//! directory, pulling from a loopback registry; the second takes the first one's layers from
//! the cache and downloads none. A cache that others could write to, reach, or that is a
//! symlink is refused, naming the problem.

mod common;
#[path = "common/loopback.rs"]
mod loopback;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::*;
use loopback::{tools, Loopback};
use wharf_images::registry::RegistryOptions;
use wharf_images::{ErrorKind, ImageStore, PullEvent, SharedCache};

fn fetched(events: &[PullEvent]) -> Vec<bool> {
    events
        .iter()
        .filter_map(|e| match e {
            PullEvent::Layer { fetched, .. } => Some(*fetched),
            _ => None,
        })
        .collect()
}

#[test]
fn a_second_node_takes_the_first_nodes_layers_from_the_shared_cache() {
    if !tools("a_second_node_takes_the_first_nodes_layers_from_the_shared_cache") {
        return;
    }
    let reg = Loopback::start(false);
    let s = scratch();
    let layout = Layout::new(s.work.join("layout"));
    let base = gzip(
        &Tar::new()
            .dir("etc")
            .file("etc/os", b"base")
            .dir("tmp")
            .symlink("etc/link", "os")
            .bytes(),
    );
    let top = gzip(
        &Tar::new()
            .file("etc/.wh.os", b"")
            .file("app", b"top")
            .bytes(),
    );
    let m = layout.manifest(&[(LAYER_GZIP, base), (LAYER_GZIP, top)]);
    layout.index(vec![tagged(m, "v1")]);
    reg.push(&layout.dir, "v1", "test/shared", None);
    let r = reg.reference("test/shared:v1");

    let cache_dir = s.base.join("shared");
    let cache = SharedCache::open(&cache_dir).unwrap();
    assert_eq!(
        fs::metadata(&cache_dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let node = |name: &str| {
        ImageStore::open(s.base.join(name))
            .unwrap()
            .with_shared_cache(Some(cache.clone()))
    };
    let (first, second) = (node("node1"), node("node2"));
    let pull = |store: &ImageStore| {
        let mut events = Vec::new();
        let info = store
            .pull(&r, &RegistryOptions::default(), &mut |e| events.push(e))
            .unwrap();
        (info, fetched(&events))
    };
    let (one, f1) = pull(&first);
    assert_eq!(f1, [true, true]);
    assert_eq!(fs::read_dir(cache_dir.join("layers")).unwrap().count(), 2);
    assert_eq!(fs::read_dir(cache_dir.join("tmp")).unwrap().count(), 0);
    let before = reg.blob_gets();
    let (two, f2) = pull(&second);
    assert_eq!(f2, [false, false], "the second node downloaded a layer");
    // Only the config was asked for again: no layer blob.
    let mut gets = reg.blob_gets();
    for (d, n) in &before {
        *gets.get_mut(d).unwrap() -= n;
    }
    gets.retain(|_, n| *n > 0);
    assert_eq!(gets.len(), 1, "{gets:?}");
    assert!(gets.values().all(|n| *n == 1), "{gets:?}");
    // The same root, whiteouts applied, link kept.
    assert_eq!(one.digest, two.digest);
    let root = &two.rootfs;
    assert_eq!(fs::read(root.join("app")).unwrap(), b"top");
    assert!(!root.join("etc/os").exists());
    assert_eq!(
        fs::read_link(root.join("etc/link")).unwrap().to_str(),
        Some("os")
    );
    assert_eq!(
        fs::read(
            first
                .root()
                .join("roots")
                .join(&one.digest[7..])
                .join("rootfs/app")
        )
        .unwrap(),
        b"top"
    );
    s.assert_no_leftovers();
}

#[test]
fn a_cache_others_could_write_or_reach_or_that_is_a_symlink_is_refused() {
    let s = scratch();
    let dir = s.base.join("shared");
    SharedCache::open(&dir).unwrap();
    let refused = |path: &std::path::Path| {
        let e = SharedCache::open(path).unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{e}");
        e.to_string()
    };
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o770)).unwrap();
    let e = refused(&dir);
    assert!(e.contains("writable by non-root users"), "{e}");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o705)).unwrap();
    let e = refused(&dir);
    assert!(e.contains("open to group or others"), "{e}");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    let link = s.base.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let e = refused(&link);
    assert!(e.contains("is a symlink"), "{e}");
    // A layers/ directory opened up later is refused too.
    fs::set_permissions(dir.join("layers"), fs::Permissions::from_mode(0o777)).unwrap();
    let e = refused(&dir);
    assert!(e.contains("layers") && e.contains("writable"), "{e}");
    fs::set_permissions(dir.join("layers"), fs::Permissions::from_mode(0o700)).unwrap();
    // A directory above that anyone may write to (not sticky) lets them swap the cache.
    let open = s.base.join("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let e = refused(&open.join("cache"));
    assert!(e.contains("above it is writable"), "{e}");
    let e = SharedCache::open(std::path::Path::new("relative/cache")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    // A layer directory in the cache that fails the checks is ignored.
    let cache = SharedCache::open(&dir).unwrap();
    let hex = "ab".repeat(32);
    fs::create_dir(dir.join("layers").join(&hex)).unwrap();
    fs::set_permissions(
        dir.join("layers").join(&hex),
        fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    assert!(cache.layer(&hex).is_some());
    fs::set_permissions(
        dir.join("layers").join(&hex),
        fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    assert!(cache.layer(&hex).is_none());
}
