//! The cluster-wide layer cache (`[images] shared_cache`): two node stores over one cache
//! directory, pulling from a loopback registry; the second takes the first one's layers from
//! the cache and downloads none. Under `shared_cache_quota` the least recently used layer goes
//! when a node adds one, never one another node is copying. A cache that others could write
//! to, reach, or that is a symlink is refused, naming the problem.

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

/// Sets the last use of layer `digest` in the shared cache at `cache` to `age` ago.
fn last_used(cache: &std::path::Path, digest: &str, age: std::time::Duration) {
    fs::File::options()
        .write(true)
        .open(cache.join("meta").join(format!("{}.json", &digest[7..])))
        .unwrap()
        .set_modified(std::time::SystemTime::now() - age)
        .unwrap();
}

fn cached(cache: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(cache.join("layers"))
        .unwrap()
        .map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    v.sort();
    v
}

#[test]
fn under_a_quota_nodes_adding_layers_evict_the_least_recently_used_one_but_not_one_being_copied() {
    let test = "under_a_quota_nodes_adding_layers_evict_the_least_recently_used_one_but_not_one_being_copied";
    if !tools(test) {
        return;
    }
    let reg = Loopback::start(false);
    let s = scratch();
    let layout = Layout::new(s.work.join("layout"));
    // Three layers of 4000, 3000 and 3000 bytes: app1 = base + one, app2 = base + two.
    let layer = |name: &str, size: usize| gzip(&Tar::new().file(name, &vec![b'x'; size]).bytes());
    let (base, one, two) = (layer("base", 4000), layer("one", 3000), layer("two", 3000));
    let m1 = layout.manifest(&[(LAYER_GZIP, base.clone()), (LAYER_GZIP, one)]);
    let m2 = layout.manifest(&[(LAYER_GZIP, base), (LAYER_GZIP, two)]);
    layout.index(vec![tagged(m1, "v1"), tagged(m2, "v2")]);
    for tag in ["v1", "v2"] {
        reg.push(&layout.dir, tag, "test/quota", None);
    }
    let cache_dir = s.base.join("shared");
    let cache = SharedCache::open(&cache_dir)
        .unwrap()
        .with_quota(Some(8000));
    let node = |name: &str| {
        ImageStore::open(s.base.join(name))
            .unwrap()
            .with_shared_cache(Some(cache.clone()))
    };
    let (n1, n2, n3) = (node("node1"), node("node2"), node("node3"));
    let pull = |store: &ImageStore, tag: &str| {
        let mut events = Vec::new();
        let info = store
            .pull(
                &reg.reference(&format!("test/quota:{tag}")),
                &RegistryOptions::default(),
                &mut |e| events.push(e),
            )
            .unwrap();
        (info.layers, fetched(&events))
    };
    // Node 1 publishes base and one (7000 bytes: under the quota); node 2 takes both.
    let (app1, f) = pull(&n1, "v1");
    assert_eq!(f, [true, true]);
    let (base_d, one_d) = (app1[0].clone(), app1[1].clone());
    assert_eq!(cache.bytes().unwrap(), 7000);
    let (_, f) = pull(&n2, "v1");
    assert_eq!(f, [false, false]);
    // "one" was used long ago, "base" less long ago.
    last_used(&cache_dir, &one_d, std::time::Duration::from_secs(3600));
    last_used(&cache_dir, &base_d, std::time::Duration::from_secs(600));
    // Node 1 adds "two": 10000 bytes, over; "one", least recently used, goes.
    let (app2, f) = pull(&n1, "v2");
    assert_eq!(f, [false, true]);
    let two_d = app2[1].clone();
    let mut want = vec![base_d.clone(), two_d.clone()];
    want.sort();
    assert_eq!(cached(&cache_dir), want);
    assert_eq!(cache.bytes().unwrap(), 7000);
    // Node 1 drops app1 ("one" goes from its store) and pulls it again: "one" is downloaded
    // and published again. Another node is copying "base" out now (its lease), so the
    // eviction passes over it, though it is the least recently used, and "two" goes.
    n1.remove(&reg.reference("test/quota:v1").to_string())
        .unwrap();
    last_used(&cache_dir, &base_d, std::time::Duration::from_secs(7200));
    last_used(&cache_dir, &two_d, std::time::Duration::from_secs(3600));
    let lease = cache_dir
        .join("leases")
        .join(format!("{}.othernode-1-0-0", &base_d[7..]));
    fs::write(&lease, b"").unwrap();
    let (_, f) = pull(&n1, "v1");
    assert_eq!(f, [false, true]);
    let mut want = vec![base_d.clone(), one_d.clone()];
    want.sort();
    assert_eq!(
        cached(&cache_dir),
        want,
        "the layer being copied was evicted"
    );
    // Node 3 takes what is left from the cache.
    let (_, f) = pull(&n3, "v1");
    assert_eq!(f, [false, false]);
    // `wharf image prune --shared --all`: everything but what a node is copying.
    let dry = cache.evict(0, true).unwrap().unwrap();
    assert_eq!(dry.layers, std::slice::from_ref(&one_d));
    assert_eq!(dry.in_use, std::slice::from_ref(&base_d));
    assert_eq!(cached(&cache_dir).len(), 2);
    fs::remove_file(&lease).unwrap();
    let r = cache.evict(0, false).unwrap().unwrap();
    assert_eq!(r.layers.len(), 2);
    assert_eq!((r.bytes, r.cache_bytes), (7000, 0));
    assert!(cached(&cache_dir).is_empty());
    assert_eq!(fs::read_dir(cache_dir.join("tmp")).unwrap().count(), 0);
    assert_eq!(fs::read_dir(cache_dir.join("meta")).unwrap().count(), 0);
    // The nodes' own images are untouched.
    for n in [&n1, &n2, &n3] {
        assert!(n.get(&reg.reference("test/quota:v1").to_string()).is_ok());
    }
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
