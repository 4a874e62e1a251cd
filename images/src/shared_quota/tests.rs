//! The shared cache's quota: the policy, and two nodes' stores over one cache directory.

use super::*;

fn layer(hex: &str, size: u64, used: u64, leased: bool) -> SharedLayer {
    SharedLayer {
        hex: hex.into(),
        size,
        last_used_ms: used,
        leased,
    }
}

#[test]
fn the_least_recently_used_layers_go_first_and_a_leased_one_stays() {
    let layers = [
        layer("c", 30, 300, false),
        layer("a", 10, 100, true),
        layer("b", 20, 200, false),
        layer("d", 40, 400, false),
    ];
    // Under 100 bytes: nothing goes.
    assert_eq!(plan(&layers, 100).remove, Vec::<String>::new());
    // 70 bytes: "a" is oldest but being copied; "b" goes, then "c" is not needed.
    let p = plan(&layers, 80);
    assert_eq!(p.remove, ["b"]);
    assert_eq!(p.kept, ["a"]);
    assert_eq!(p.bytes_after, 80);
    let p = plan(&layers, 0);
    assert_eq!(p.remove, ["b", "c", "d"]);
    assert_eq!(p.bytes_after, 10);
    // The same input in another order: the same decision (ties broken by name).
    let mut again = layers.to_vec();
    again.reverse();
    assert_eq!(plan(&again, 0), plan(&layers, 0));
    let tie = [layer("y", 1, 5, false), layer("x", 1, 5, false)];
    assert_eq!(plan(&tie, 1).remove, ["x"]);
}

use crate::limits::{Budget, Limits};
use crate::shared::SharedCache;
use crate::ErrorKind;

/// A shared cache and two nodes' stores (their `tmp/` is where copies land).
struct Nodes {
    _dir: tempfile::TempDir,
    cache: SharedCache,
    node: [PathBuf; 2],
}

fn nodes() -> Nodes {
    let dir = tempfile::tempdir().unwrap();
    let cache = SharedCache::open(&dir.path().join("shared")).unwrap();
    let node = ["node1", "node2"].map(|n| {
        let root = dir.path().join(n);
        fs::create_dir_all(root.join("tmp")).unwrap();
        root
    });
    Nodes {
        _dir: dir,
        cache,
        node,
    }
}

fn hex(c: char) -> String {
    c.to_string().repeat(64)
}

fn budget() -> Budget {
    Budget::new(Limits::default())
}

impl Nodes {
    /// Node `n` publishes layer `c`: one file of `size` bytes, last used `age_s` ago.
    fn publish(&self, n: usize, c: char, size: usize, age_s: u64) {
        let src = self.node[n].join(format!("src-{c}"));
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("f"), vec![b'x'; size]).unwrap();
        assert!(self
            .cache
            .publish(&hex(c), &src, size as u64, &mut budget())
            .unwrap());
        self.used(c, age_s);
    }

    /// Sets layer `c`'s last use to `age_s` ago.
    fn used(&self, c: char, age_s: u64) {
        let f = OpenOptions::new()
            .write(true)
            .open(record_path(self.cache.root(), &hex(c)))
            .unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(age_s))
            .unwrap();
    }

    fn layers(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.cache.root().join("layers"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy()[..1].to_string())
            .collect();
        v.sort();
        v
    }

    /// Node `n` copies layer `c` out; its file's length.
    fn copy(&self, n: usize, c: char) -> Option<u64> {
        let staging = self
            .cache
            .copy_out(&hex(c), &self.node[n].join("tmp"), &mut budget())
            .unwrap()?;
        Some(fs::metadata(staging.path.join("f")).unwrap().len())
    }
}

fn short(r: &[String]) -> Vec<String> {
    r.iter().map(|d| d[7..8].to_string()).collect()
}

#[test]
fn under_a_small_quota_the_least_recently_used_layer_goes_and_one_being_copied_stays() {
    let n = nodes();
    n.publish(0, 'a', 1000, 300);
    n.publish(0, 'b', 2000, 200);
    n.publish(1, 'c', 3000, 100);
    assert_eq!(n.cache.bytes().unwrap(), 6000);
    // Node 2 uses "a": it is now the most recently used.
    assert_eq!(n.copy(1, 'a'), Some(1000));
    let r = n.cache.evict(4500, true).unwrap().unwrap();
    assert_eq!(short(&r.layers), ["b"]);
    assert_eq!((r.bytes, r.cache_bytes), (2000, 4000));
    assert_eq!(n.layers(), ["a", "b", "c"], "a dry run removed something");
    // Node 1 is copying "b" out now: "c" goes instead, and "b" is named as kept.
    let lease = Lease::take(n.cache.root(), &hex('b')).unwrap();
    let r = n.cache.evict(4500, false).unwrap().unwrap();
    assert_eq!(short(&r.layers), ["c"]);
    assert_eq!(short(&r.in_use), ["b"]);
    assert_eq!(n.layers(), ["a", "b"]);
    assert!(!record_path(n.cache.root(), &hex('c')).exists());
    drop(lease);
    assert!(fs::read_dir(n.cache.root().join(LEASES))
        .unwrap()
        .next()
        .is_none());
    // The copy ended: "b" may go.
    let r = n.cache.evict(1000, false).unwrap().unwrap();
    assert_eq!(short(&r.layers), ["b"]);
    assert_eq!(n.layers(), ["a"]);
    // A node asking for an evicted layer finds none (and downloads it).
    assert_eq!(n.copy(0, 'c'), None);
    // Nothing is left in tmp/: the evicted layers were deleted.
    assert!(fs::read_dir(n.cache.root().join("tmp"))
        .unwrap()
        .next()
        .is_none());
    // A lease older than its time keeps nothing, and is deleted.
    let lease = Lease::take(n.cache.root(), &hex('a')).unwrap();
    fs::File::options()
        .write(true)
        .open(&lease.path)
        .unwrap()
        .set_modified(SystemTime::now() - LEASE_TTL - Duration::from_secs(1))
        .unwrap();
    let r = n.cache.evict(0, false).unwrap().unwrap();
    assert_eq!(short(&r.layers), ["a"]);
    assert!(!lease.path.exists());
}

#[test]
fn a_node_adding_a_layer_evicts_down_to_the_quota() {
    let n = nodes();
    let cache = n.cache.clone().with_quota(Some(2500));
    n.publish(0, 'a', 1000, 300);
    n.publish(1, 'b', 1000, 200);
    cache.enforce_quota();
    assert_eq!(n.layers(), ["a", "b"]);
    // Node 2 adds "c": the cache is over; "a", least recently used, goes.
    n.publish(1, 'c', 1000, 0);
    cache.enforce_quota();
    assert_eq!(n.layers(), ["b", "c"]);
    // Another node that publishes "b" again adds nothing.
    let src = n.node[0].join("src-b");
    assert!(!cache.publish(&hex('b'), &src, 1000, &mut budget()).unwrap());
}

#[test]
fn one_eviction_runs_at_a_time_and_one_left_by_a_dead_node_is_taken_over() {
    let n = nodes();
    n.publish(0, 'a', 1000, 300);
    let held = EvictLock::try_take(n.cache.root()).unwrap().unwrap();
    // The other node's eviction does nothing while this one runs.
    assert!(n.cache.evict(0, false).unwrap().is_none());
    assert_eq!(n.layers(), ["a"]);
    // Its node died: an hour later, the next takes over.
    fs::File::options()
        .write(true)
        .open(&held.path)
        .unwrap()
        .set_modified(SystemTime::now() - LOCK_TTL - Duration::from_secs(1))
        .unwrap();
    std::mem::forget(held);
    let r = n.cache.evict(0, false).unwrap().unwrap();
    assert_eq!(short(&r.layers), ["a"]);
    assert!(!n.cache.root().join(EVICT_LOCK).exists());
}

#[test]
fn a_copy_whose_source_was_evicted_meanwhile_is_refused() {
    let n = nodes();
    n.publish(0, 'a', 1000, 300);
    let tmp = n.node[1].join("tmp");
    // The copy's own lease keeps the layer from an eviction while it runs.
    let staging = n
        .cache
        .copy_out_then(&hex('a'), &tmp, &mut budget(), || {
            let r = n.cache.evict(0, false).unwrap().unwrap();
            assert!(r.layers.is_empty());
            assert_eq!(short(&r.in_use), ["a"]);
        })
        .unwrap()
        .unwrap();
    drop(staging);
    // A lease that expired (a copy slower than its time, or a clock far behind) does
    // not: the copy is refused, not kept, and the node downloads the layer instead.
    let e = n
        .cache
        .copy_out_then(&hex('a'), &tmp, &mut budget(), || {
            for l in fs::read_dir(n.cache.root().join(LEASES)).unwrap() {
                fs::File::options()
                    .write(true)
                    .open(l.unwrap().path())
                    .unwrap()
                    .set_modified(SystemTime::now() - LEASE_TTL * 2)
                    .unwrap();
            }
            let r = n.cache.evict(0, false).unwrap().unwrap();
            assert_eq!(short(&r.layers), ["a"]);
        })
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("evicted"), "{e}");
    assert!(
        fs::read_dir(&tmp).unwrap().next().is_none(),
        "a partial copy was kept"
    );
    // A layer evicted and published again at once is another directory: refused too.
    n.publish(0, 'b', 1000, 300);
    let e = n
        .cache
        .copy_out_then(&hex('b'), &tmp, &mut budget(), || {
            let layer = n.cache.root().join("layers").join(hex('b'));
            let away = n.cache.root().join("tmp").join("away");
            fs::rename(&layer, &away).unwrap();
            fs::create_dir(&layer).unwrap();
            let mode = <fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700);
            fs::set_permissions(&layer, mode).unwrap();
            fs::remove_dir_all(&away).unwrap();
        })
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    // A source that lost files while it stayed the same directory to the copier (storage
    // whose attribute cache hid the eviction's rename): less content than its record says.
    n.publish(0, 'c', 1000, 300);
    let e = n
        .cache
        .copy_out_then(&hex('c'), &tmp, &mut budget(), || {})
        .map(|_| ())
        .and_then(|()| {
            fs::remove_file(n.cache.root().join("layers").join(hex('c')).join("f")).unwrap();
            n.cache
                .copy_out_then(&hex('c'), &tmp, &mut budget(), || {})
                .map(|_| ())
        })
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    assert!(
        fs::read_dir(&tmp).unwrap().next().is_none(),
        "a partial copy was kept"
    );
}

#[test]
fn opening_the_cache_deletes_expired_leases_only() {
    let n = nodes();
    let old = Lease::take(n.cache.root(), &hex('a')).unwrap();
    let live = Lease::take(n.cache.root(), &hex('b')).unwrap();
    fs::File::options()
        .write(true)
        .open(&old.path)
        .unwrap()
        .set_modified(SystemTime::now() - LEASE_TTL - Duration::from_secs(1))
        .unwrap();
    SharedCache::open(n.cache.root()).unwrap();
    assert!(!old.path.exists());
    assert!(live.path.exists());
}

#[test]
fn a_layer_published_before_records_were_kept_is_measured_once() {
    let n = nodes();
    n.publish(0, 'a', 1000, 300);
    fs::remove_file(record_path(n.cache.root(), &hex('a'))).unwrap();
    let layers = scan(n.cache.root(), now_ms()).unwrap();
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0].size, 1000);
    assert!(record_path(n.cache.root(), &hex('a')).exists());
    // Junk in the cache is not a layer.
    fs::create_dir(n.cache.root().join("layers").join("junk")).unwrap();
    assert_eq!(scan(n.cache.root(), now_ms()).unwrap().len(), 1);
}

#[test]
fn a_lease_holds_for_its_time_and_one_from_a_clock_ahead_too() {
    let ttl = ms_of(LEASE_TTL);
    assert!(lease_live(1_000, 1_000));
    assert!(lease_live(1_000, 1_000 + ttl - 1));
    assert!(!lease_live(1_000, 1_000 + ttl));
    assert!(lease_live(5_000, 1_000));
}
