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
//!   Where the storage's attribute cache hides the rename from the copier (NFS clients cache
//!   attributes for seconds), a copy with less file content than the layer's record says is
//!   refused the same way. A partial copy is never kept.
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
/// The size layer `hex`'s record gives (bytes of file content, as its publisher measured
/// them); `None` without a readable record.
pub(crate) fn recorded_size(cache: &Path, hex: &str) -> Option<u64> {
    let bytes = fs::read(record_path(cache, hex)).ok()?;
    serde_json::from_slice::<Record>(&bytes)
        .ok()
        .map(|r| r.size)
}

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

/// Deletes the leases that expired (their nodes died mid-copy).
pub(crate) fn clear_expired_leases(cache: &Path) {
    leased(cache, now_ms());
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
    let trash = if dry_run {
        None
    } else {
        Some(Staging::create(
            &cache.join(crate::shared::TMP),
            "evict",
            0o700,
        )?)
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
mod tests;
