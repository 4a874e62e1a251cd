//! The shared layer cache's quota (`[images] shared_cache_quota`): what each layer takes, when
//! a node last used it, which layers a node is copying out now, and eviction of the least
//! recently used ones down to the quota.
//!
//! ```text
//! <cache>/meta/<hex>.json          a layer's record: its unpacked size; mtime = last use
//! <cache>/leases/<hex>.<copier>    a node copying the layer out now; mtime = when it began
//! <cache>/evict.lock               exists while a node evicts
//! ```
//!
//! Several nodes write the cache at once, over storage such as NFS, so nothing here relies on
//! `flock`: NFS emulates it with the lock manager (NFSv3) or server state (NFSv4), a lock held
//! by a node that died lingers or vanishes with the server's grace periods, and a client
//! mounted with `nolock` keeps its locks to itself without a word. What every NFS version
//! does guarantee across clients is used instead: creating a file with `O_CREAT|O_EXCL` is
//! atomic at the server, `rename` within one export is atomic, and a time set explicitly
//! (`utimensat`) is stored at the server as given. So:
//!
//! - **Last use** is a record's mtime, set explicitly by the node that used the layer (copied
//!   it out, or published it). Not atime: `noatime`/`relatime` mounts and client attribute
//!   caching make it useless. Stamps come from each node's clock; a skew of seconds only
//!   reorders layers used within seconds of each other.
//! - **A copy in progress** holds a lease: a file of its own under `leases/`, made with
//!   `O_EXCL` (the name is unique to the node, process and copy) and stamped with the
//!   copier's clock, deleted when the copy ends. An eviction skips a layer with a lease
//!   younger than [`LEASE_TTL`] and deletes older ones (their node died mid-copy).
//! - **The lease is a margin, not the safety**: a copy notes its source directory's identity
//!   (device, inode, ctime) before it starts and checks it again once it is done; an eviction
//!   renames a layer away (into `tmp/`) before deleting it, so a source that was evicted
//!   meanwhile (a lease that expired, an eviction that decided between a copier's lease and
//!   its start) fails the check, and the node downloads the layer from the registry instead.
//!   A partial copy is never kept.
//! - **One eviction at a time** is `evict.lock`, made with `O_EXCL` and deleted when done; one
//!   older than an hour (its node died) is removed by the next. Two evictions at once would do
//!   no harm, only double work: each layer is renamed away once, and the other finds it gone.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::cache::{is_hex64, Removed};
use crate::error::{ImageError, Result};
use crate::staging::{write_synced, Staging};

pub(crate) const META: &str = "meta";
pub(crate) const LEASES: &str = "leases";
const EVICT_LOCK: &str = "evict.lock";
/// A lease older than this no longer keeps its layer: its node died mid-copy (a live copy of
/// the largest layer takes minutes).
pub(crate) const LEASE_TTL: Duration = Duration::from_secs(3600);
/// An `evict.lock` older than this was left by a node that died while evicting.
const LOCK_TTL: Duration = Duration::from_secs(3600);

/// A layer of the shared cache as an eviction sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedLayer {
    pub hex: String,
    /// Bytes of file content.
    pub size: u64,
    /// Last use, ms since the Unix epoch.
    pub last_used_ms: u64,
    /// Whether a node is copying it out now.
    pub leased: bool,
}

/// What an eviction decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Layers to remove, least recently used first.
    pub remove: Vec<String>,
    /// Layers that would have gone but are being copied.
    pub kept: Vec<String>,
    /// Bytes the cache holds once the layers are removed.
    pub bytes_after: u64,
}

/// Which layers go to bring `layers` down to `quota` bytes: least recently used first, never
/// one being copied.
pub(crate) fn plan(layers: &[SharedLayer], quota: u64) -> Plan {
    let mut bytes: u64 = layers.iter().map(|l| l.size).sum();
    let mut order: Vec<&SharedLayer> = layers.iter().collect();
    order.sort_by(|a, b| (a.last_used_ms, &a.hex).cmp(&(b.last_used_ms, &b.hex)));
    let mut out = Plan::default();
    for l in order {
        if bytes <= quota {
            break;
        }
        if l.leased {
            out.kept.push(l.hex.clone());
            continue;
        }
        bytes -= l.size;
        out.remove.push(l.hex.clone());
    }
    out.bytes_after = bytes;
    out
}

/// Whether a lease stamped at `stamp_ms` still holds at `now_ms` (one stamped in the future,
/// by a node whose clock is ahead, does).
pub(crate) fn lease_live(stamp_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(stamp_ms) < ms_of(LEASE_TTL)
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// This node's clock, ms since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    ms(SystemTime::now())
}

fn mtime_ms(meta: &fs::Metadata) -> u64 {
    let ms = meta.mtime().saturating_mul(1000) + meta.mtime_nsec() / 1_000_000;
    u64::try_from(ms).unwrap_or(0)
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A name no other node, process or copy uses: host, pid, a counter and the time.
fn unique() -> String {
    let host: String = fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(64)
        .collect();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{host}-{}-{}-{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates `path` with `O_EXCL`, stamped with this node's clock; `Ok(false)` when it exists.
fn create_new(path: &Path, body: &[u8]) -> std::io::Result<bool> {
    let mut file = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
        Err(e) => return Err(e),
    };
    std::io::Write::write_all(&mut file, body)?;
    // The server stamped it with its own clock; the readers compare with nodes' clocks.
    file.set_modified(SystemTime::now())?;
    Ok(true)
}

/// A copy out of layer `hex` in progress: its lease file, deleted when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    path: PathBuf,
}

impl Lease {
    /// Takes a lease on layer `hex` of the cache at `cache`.
    pub fn take(cache: &Path, hex: &str) -> Result<Lease> {
        loop {
            let path = cache.join(LEASES).join(format!("{hex}.{}", unique()));
            match create_new(&path, b"") {
                Ok(true) => return Ok(Lease { path }),
                Ok(false) => continue,
                Err(e) => return Err(ImageError::io(format!("creating {}", path.display()), e)),
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// `evict.lock`, held by the eviction running now; deleted when dropped.
#[derive(Debug)]
struct EvictLock {
    path: PathBuf,
}

impl EvictLock {
    /// Takes the lock unless another node's eviction holds it (`None`); removes one left by a
    /// node that died.
    fn try_take(cache: &Path) -> Result<Option<EvictLock>> {
        let path = cache.join(EVICT_LOCK);
        let fail = |e| ImageError::io(format!("creating {}", path.display()), e);
        for _ in 0..2 {
            if create_new(&path, unique().as_bytes()).map_err(fail)? {
                return Ok(Some(EvictLock { path }));
            }
            let stale = fs::symlink_metadata(&path).ok().is_some_and(|m| {
                ms(SystemTime::now()).saturating_sub(mtime_ms(&m)) > ms_of(LOCK_TTL)
            });
            if !stale {
                return Ok(None);
            }
            let _ = fs::remove_file(&path);
        }
        Ok(None)
    }
}

fn ms_of(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Drop for EvictLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// A layer's record in `meta/`.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    digest: String,
    size: u64,
}

fn record_path(cache: &Path, hex: &str) -> PathBuf {
    cache.join(META).join(format!("{hex}.json"))
}

/// Writes layer `hex`'s record (its `size`), last used at `used`, atomically (a rename from
/// `tmp/`).
pub(crate) fn write_record(cache: &Path, hex: &str, size: u64, used: SystemTime) -> Result<()> {
    let json = serde_json::to_vec(&Record {
        digest: format!("sha256:{hex}"),
        size,
    })
    .map_err(|e| ImageError::invalid(format!("encoding a layer record: {e}")))?;
    let staging = Staging::create(&cache.join(crate::shared::TMP), "meta", 0o700)?;
    let tmp = staging.path.join("r");
    write_synced(&tmp, &json)?;
    let stamp = || -> std::io::Result<()> {
        OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?
            .set_modified(used)
    };
    stamp().map_err(|e| ImageError::io(format!("stamping {}", tmp.display()), e))?;
    let dest = record_path(cache, hex);
    fs::rename(&tmp, &dest).map_err(|e| ImageError::io(format!("writing {}", dest.display()), e))
}

/// Records that layer `hex` was used now (best effort: a missing record is made again).
pub(crate) fn touch_record(cache: &Path, hex: &str) {
    if let Ok(f) = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(record_path(cache, hex))
    {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// The layers with a live lease at `now_ms`; deletes the leases that expired.
fn leased(cache: &Path, now_ms: u64) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    let Ok(entries) = fs::read_dir(cache.join(LEASES)) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(hex) = name.to_str().and_then(|n| n.split('.').next()) else {
            continue;
        };
        let Ok(meta) = fs::symlink_metadata(e.path()) else {
            continue;
        };
        if lease_live(mtime_ms(&meta), now_ms) {
            out.insert(hex.to_string());
        } else {
            let _ = fs::remove_file(e.path());
        }
    }
    out
}

/// The cache's layers as found on disk at `now_ms`: each one's size and last use from its
/// record (a layer without one, published before records were kept or by a node that
/// crashed before writing it, is measured once and stamped with the directory's mtime).
pub(crate) fn scan(cache: &Path, now_ms: u64) -> Result<Vec<SharedLayer>> {
    let leases = leased(cache, now_ms);
    let dir = cache.join(crate::shared::LAYERS);
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| ImageError::io(dir.display(), e))? {
        let entry = entry.map_err(|e| ImageError::io(dir.display(), e))?;
        let Some(hex) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !is_hex64(&hex) {
            continue;
        }
        let record = record_path(cache, &hex);
        let found = fs::read(&record)
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
            .zip(fs::symlink_metadata(&record).ok());
        let (size, last_used_ms) = match found {
            Some((r, meta)) => (r.size, mtime_ms(&meta)),
            None => {
                let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                    continue; // evicted meanwhile
                };
                let size = crate::store::tree_size(&entry.path())?;
                let used = meta.modified().unwrap_or(UNIX_EPOCH);
                write_record(cache, &hex, size, used)?;
                (size, ms(used))
            }
        };
        out.push(SharedLayer {
            leased: leases.contains(&hex),
            hex,
            size,
            last_used_ms,
        });
    }
    Ok(out)
}

/// Evicts layers of the cache at `cache` down to `quota` bytes (see [`plan`]); with
/// `dry_run`, only says which. `None` when another node's eviction runs now.
pub(crate) fn evict(cache: &Path, quota: u64, dry_run: bool) -> Result<Option<Removed>> {
    let Some(_lock) = EvictLock::try_take(cache)? else {
        return Ok(None);
    };
    let now = ms(SystemTime::now());
    let layers = scan(cache, now)?;
    let decided = plan(&layers, quota);
    let mut out = Removed {
        in_use: decided.kept.iter().map(|h| format!("sha256:{h}")).collect(),
        ..Default::default()
    };
    let mut bytes: u64 = layers.iter().map(|l| l.size).sum();
    let trash = match dry_run {
        true => None,
        false => Some(Staging::create(
            &cache.join(crate::shared::TMP),
            "evict",
            0o700,
        )?),
    };
    for hex in &decided.remove {
        let size = layers.iter().find(|l| &l.hex == hex).map_or(0, |l| l.size);
        if let Some(trash) = &trash {
            // A copy that began since the scan: kept (its own check would catch the removal,
            // but it need not download the layer again).
            if leased(cache, ms(SystemTime::now())).contains(hex) {
                out.in_use.push(format!("sha256:{hex}"));
                continue;
            }
            let from = cache.join(crate::shared::LAYERS).join(hex);
            match fs::rename(&from, trash.path.join(hex)) {
                Ok(()) => {}
                // Another node's eviction took it.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(ImageError::io(format!("evicting {}", from.display()), e)),
            }
            let _ = fs::remove_file(record_path(cache, hex));
        }
        out.layers.push(format!("sha256:{hex}"));
        out.bytes += size;
        bytes -= size;
    }
    out.cache_bytes = bytes;
    if !dry_run {
        clear_stale_records(cache);
    }
    Ok(Some(out))
}

/// Deletes the records of layers that are gone (a node that crashed between the two).
fn clear_stale_records(cache: &Path) {
    let Ok(entries) = fs::read_dir(cache.join(META)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
            continue;
        };
        if !cache.join(crate::shared::LAYERS).join(hex).exists() {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// The identity of directory `dir`, which a rename and a new directory at its path change.
pub(crate) fn identity(dir: &Path) -> Option<(u64, u64, i64, i64)> {
    let m = fs::symlink_metadata(dir).ok()?;
    Some((m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

#[cfg(test)]
mod tests {
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
}
