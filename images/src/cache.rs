//! The registry cache: what pulled images take on disk, when each was last used, which are
//! in use, and eviction down to a quota.
//!
//! ```text
//! roots/<hex>/pin            a root's pin file: held shared while in use; mtime = last use
//! roots/<hex>/layers.json    the layers it was stacked from (blob digests, bottom first)
//! roots/<hex>/config.json    the image config (entrypoint, env, user, ...)
//! meta/<hex>.json            a layer's record: its unpacked size; mtime = last use
//! locks/cache.lock           held shared by every pull, exclusive by an eviction
//! ```
//!
//! A root is in use while anyone holds its pin file with a shared `flock`: the agent from the
//! launch of a job on it to the job's end, and the job's shim for its whole life (so a
//! restarted agent loses no pin). Eviction takes each root's pin exclusively without waiting
//! and skips the roots it cannot have; a pin taken after a root went away finds its file
//! moved and fails, so a root is never removed under a job. Layers are only the sources a
//! root's files are hard-linked from: a job never uses them, but a pull does, so every pull
//! holds the cache lock shared from its start to its end and an eviction waits for none of
//! them (it is skipped after a pull while another one runs; the last pull to end does it).
//!
//! What is counted against the quota is the bytes of file content of the layers: a root's
//! files are hard links to its layers', and the eviction never removes a layer that a
//! remaining root was stacked from. Everything removed is first renamed into `tmp/` (names,
//! then the root, then its layers), so a crash leaves whole images or nothing, and the next
//! opening of the store deletes what was on its way out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::error::{ErrorKind, ImageError, Result};
use crate::layers::{LAYERS, LOCKS, ROOTS};
use crate::staging::{write_synced, Staging};
use crate::store::{ImageInfo, ImageStore, TMP};

pub(crate) const META: &str = "meta";
pub(crate) const PIN: &str = "pin";
pub(crate) const LAYERS_JSON: &str = "layers.json";
pub(crate) const CONFIG_JSON: &str = "config.json";
const CACHE_LOCK: &str = "cache.lock";

/// `flock(op)` on `file`, retried when interrupted; `Ok(false)` when `LOCK_NB` was asked and
/// another holds it.
fn flock(file: &File, op: libc::c_int) -> std::io::Result<bool> {
    loop {
        // SAFETY: flock on a descriptor `file` owns.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let err = std::io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if op & libc::LOCK_NB != 0 => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// Whether `path` (not followed) is the file open as `file`.
pub(crate) fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

fn open_pin(path: &Path, create: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

fn mtime_ms(path: &Path) -> Option<u64> {
    let m = fs::symlink_metadata(path).ok()?;
    let ms = m.mtime().saturating_mul(1000) + m.mtime_nsec() / 1_000_000;
    u64::try_from(ms).ok()
}

/// An image root in use, by a job or a pull: it is not evicted or removed while this is held.
/// Taking and dropping it record the root's last use.
///
/// ```no_run
/// use std::path::PathBuf;
/// use wharf_images::{ImageStore, Pin};
/// let store = ImageStore::open(PathBuf::from("/var/lib/wharf/images"))?;
/// let info = store.get("registry.example/app:v1")?;
/// let pin = Pin::rootfs(&info.rootfs)?;
/// // ... run the job on info.rootfs ...
/// drop(pin);
/// # Ok::<(), wharf_images::ImageError>(())
/// ```
#[derive(Debug)]
pub struct Pin {
    file: File,
}

impl Pin {
    /// Pins the image whose root filesystem is `rootfs` (an [`ImageInfo::rootfs`]): a shared
    /// lock on the pin file beside it, waiting while an eviction is deciding about it.
    ///
    /// Errors: `NotFound` when the image was removed or evicted (before or while waiting).
    pub fn rootfs(rootfs: &Path) -> Result<Pin> {
        let dir = rootfs.parent().ok_or_else(|| {
            ImageError::invalid(format!("{} is not an image's root", rootfs.display()))
        })?;
        Pin::take(dir)
    }

    /// Pins the image directory `dir` (holding `rootfs/`).
    pub(crate) fn take(dir: &Path) -> Result<Pin> {
        let path = dir.join(PIN);
        let gone = || {
            ImageError::not_found(format!(
                "the image root {} is gone (removed, or evicted from the image cache)",
                dir.display()
            ))
        };
        let file = match open_pin(&path, true) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(gone()),
            Err(e) => return Err(ImageError::io(format!("opening {}", path.display()), e)),
        };
        flock(&file, libc::LOCK_SH)
            .map_err(|e| ImageError::io(format!("locking {}", path.display()), e))?;
        // An eviction that had it before us moved the directory away.
        if !same_file(&file, &path) || !dir.join("rootfs").is_dir() {
            return Err(gone());
        }
        let pin = Pin { file };
        pin.touch();
        Ok(pin)
    }

    fn touch(&self) {
        let _ = self.file.set_modified(SystemTime::now());
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.touch();
    }
}

/// Whether the image directory `dir` is pinned now (its pin file held by someone).
fn pinned(dir: &Path) -> bool {
    match open_pin(&dir.join(PIN), false) {
        Ok(f) => !flock(&f, libc::LOCK_EX | libc::LOCK_NB).unwrap_or(false),
        Err(_) => false,
    }
}

/// The image directory `dir`'s pin taken exclusively, when no one uses it; `None` when in use.
pub(crate) fn claim(dir: &Path) -> Result<Option<File>> {
    let path = dir.join(PIN);
    let file = open_pin(&path, true)
        .map_err(|e| ImageError::io(format!("opening {}", path.display()), e))?;
    let free = flock(&file, libc::LOCK_EX | libc::LOCK_NB)
        .map_err(|e| ImageError::io(format!("locking {}", path.display()), e))?;
    Ok(free.then_some(file))
}

/// `locks/cache.lock`, shared (a pull) or exclusive (an eviction).
#[derive(Debug)]
pub(crate) struct CacheLock {
    _file: File,
}

impl CacheLock {
    fn open(store: &Path) -> Result<File> {
        let path = store.join(LOCKS).join(CACHE_LOCK);
        open_pin(&path, true).map_err(|e| ImageError::io(format!("opening {}", path.display()), e))
    }

    /// Held by a pull from its start to its end.
    pub fn shared(store: &Path) -> Result<CacheLock> {
        let file = CacheLock::open(store)?;
        flock(&file, libc::LOCK_SH)
            .map_err(|e| ImageError::io("taking the image cache lock", e))?;
        Ok(CacheLock { _file: file })
    }

    /// Held by an eviction; `None` without `wait` while a pull runs.
    pub fn exclusive(store: &Path, wait: bool) -> Result<Option<CacheLock>> {
        let file = CacheLock::open(store)?;
        let op = if wait {
            libc::LOCK_EX
        } else {
            libc::LOCK_EX | libc::LOCK_NB
        };
        let got = flock(&file, op).map_err(|e| ImageError::io("taking the image cache lock", e))?;
        Ok(got.then_some(CacheLock { _file: file }))
    }
}

/// A layer's record in `meta/`.
#[derive(Debug, Serialize, Deserialize)]
struct LayerRecord {
    digest: String,
    size: u64,
}

/// Writes layer `hex`'s record (its unpacked `size`), atomically.
pub(crate) fn record_layer(store: &Path, hex: &str, size: u64) -> Result<()> {
    let rec = LayerRecord {
        digest: format!("sha256:{hex}"),
        size,
    };
    let json = serde_json::to_vec(&rec)
        .map_err(|e| ImageError::new(ErrorKind::Unavailable, format!("encoding: {e}")))?;
    let staging = Staging::create(&store.join(TMP), "meta", 0o700)?;
    let tmp = staging.path.join("r");
    write_synced(&tmp, &json)?;
    let dest = store.join(META).join(format!("{hex}.json"));
    fs::rename(&tmp, &dest).map_err(|e| ImageError::io(format!("writing {}", dest.display()), e))
}

/// Records that layer `hex` was used now.
pub(crate) fn touch_layer(store: &Path, hex: &str) {
    let path = store.join(META).join(format!("{hex}.json"));
    if let Ok(f) = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// One layer in the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CachedLayer {
    /// Blob digest.
    pub digest: String,
    /// Bytes of file content unpacked.
    pub size: u64,
    /// Last use (a pull or a root stacked from it), ms since the Unix epoch.
    pub last_used_ms: Option<u64>,
    /// The names of the images made of it.
    pub images: Vec<String>,
}

/// One image in the store, with what the cache knows of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageStatus {
    /// The image.
    #[serde(flatten)]
    pub info: ImageInfo,
    /// Bytes it takes: its layers' content for a pulled image, its root's for an imported one.
    pub disk_size: u64,
    /// Of those, the bytes in layers other images are made of too.
    pub shared_size: u64,
    /// When a job or a pull last used it, ms since the Unix epoch.
    pub last_used_ms: Option<u64>,
    /// Whether a job (or a pull) uses it now.
    pub in_use: bool,
}

/// What an eviction or a prune removed (or, dry, would remove).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Removed {
    /// Image names removed, with their roots.
    pub images: Vec<String>,
    /// Roots removed (manifest digests).
    pub roots: Vec<String>,
    /// Layers removed (blob digests).
    pub layers: Vec<String>,
    /// Bytes of layer content freed.
    pub bytes: u64,
    /// Bytes the cache holds after it.
    pub cache_bytes: u64,
    /// Roots kept because a job uses them.
    pub in_use: Vec<String>,
}

#[derive(Debug)]
struct RootEntry {
    dir: PathBuf,
    last_used: u64,
    layers: Vec<String>,
    /// Image directories (under `images/`) that name it.
    names: Vec<(PathBuf, String)>,
}

#[derive(Debug)]
struct LayerEntry {
    size: u64,
    last_used: u64,
}

/// The cache as found on disk.
#[derive(Debug, Default)]
struct Scan {
    /// By root hex.
    roots: BTreeMap<String, RootEntry>,
    /// By layer hex.
    layers: BTreeMap<String, LayerEntry>,
}

pub(crate) fn is_hex64(name: &str) -> bool {
    name.len() == 64
        && name
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

impl Scan {
    /// Bytes the layers hold.
    fn bytes(&self) -> u64 {
        self.layers.values().map(|l| l.size).sum()
    }

    /// How many remaining roots use each layer.
    fn refcounts(&self) -> BTreeMap<String, usize> {
        let mut refs = BTreeMap::new();
        for root in self.roots.values() {
            for l in root.layers.iter().collect::<BTreeSet<_>>() {
                *refs.entry(hex_of(l).to_string()).or_insert(0) += 1;
            }
        }
        refs
    }
}

impl ImageStore {
    /// This store with `quota` bytes for pulled images' layers: each pull, once done, evicts
    /// least recently used images not in use until the cache is under it.
    pub fn with_quota(mut self, quota: Option<u64>) -> ImageStore {
        self.quota = quota;
        self
    }

    /// The cache quota, bytes.
    pub fn quota(&self) -> Option<u64> {
        self.quota
    }

    /// Reads what the cache holds. `images` are the store's images (read once by the caller).
    fn scan(&self, images: &[(PathBuf, ImageInfo)]) -> Result<Scan> {
        let root = self.root();
        let mut scan = Scan::default();
        let roots_dir = root.join(ROOTS);
        for entry in fs::read_dir(&roots_dir).map_err(|e| ImageError::io(roots_dir.display(), e))? {
            let entry = entry.map_err(|e| ImageError::io(roots_dir.display(), e))?;
            let Some(hex) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !is_hex64(&hex) {
                continue;
            }
            let dir = entry.path();
            let layers = fs::read(dir.join(LAYERS_JSON))
                .ok()
                .and_then(|b| serde_json::from_slice::<Vec<String>>(&b).ok())
                .unwrap_or_default();
            let last_used = mtime_ms(&dir.join(PIN))
                .or_else(|| mtime_ms(&dir))
                .unwrap_or(0);
            scan.roots.insert(
                hex,
                RootEntry {
                    dir,
                    last_used,
                    layers,
                    names: vec![],
                },
            );
        }
        for (dir, info) in images {
            let Some(hex) = self.root_hex(info) else {
                continue;
            };
            if let Some(r) = scan.roots.get_mut(&hex) {
                if r.layers.is_empty() {
                    r.layers = info.layers.clone();
                }
                r.names.push((dir.clone(), info.name.clone()));
            }
        }
        let layers_dir = root.join(LAYERS);
        for entry in
            fs::read_dir(&layers_dir).map_err(|e| ImageError::io(layers_dir.display(), e))?
        {
            let entry = entry.map_err(|e| ImageError::io(layers_dir.display(), e))?;
            let Some(hex) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !is_hex64(&hex) {
                continue;
            }
            let record = root.join(META).join(format!("{hex}.json"));
            let size = match fs::read(&record)
                .ok()
                .and_then(|b| serde_json::from_slice::<LayerRecord>(&b).ok())
            {
                Some(r) => r.size,
                // A layer from before records were kept: measured once.
                None => {
                    let size = crate::store::tree_size(&entry.path())?;
                    record_layer(root, &hex, size)?;
                    size
                }
            };
            let last_used = mtime_ms(&record).unwrap_or(0);
            scan.layers.insert(hex, LayerEntry { size, last_used });
        }
        Ok(scan)
    }

    /// The root directory's hex name of pulled image `info`, when its root is in `roots/`.
    fn root_hex(&self, info: &ImageInfo) -> Option<String> {
        let dir = info.rootfs.parent()?;
        if dir.parent()? != self.root().join(ROOTS) {
            return None;
        }
        let hex = dir.file_name()?.to_str()?;
        is_hex64(hex).then(|| hex.to_string())
    }

    /// The images with their directories under `images/`.
    fn named(&self) -> Result<Vec<(PathBuf, ImageInfo)>> {
        Ok(self
            .list()?
            .into_iter()
            .map(|i| (self.image_dir(&i.name), i))
            .collect())
    }

    /// Every image with its size, shared size, last use and whether it is in use, sorted by
    /// name.
    pub fn status(&self) -> Result<Vec<ImageStatus>> {
        let images = self.named()?;
        let scan = self.scan(&images)?;
        let mut users: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, info) in &images {
            for l in info.layers.iter().collect::<BTreeSet<_>>() {
                *users.entry(hex_of(l)).or_insert(0) += 1;
            }
        }
        let mut out = Vec::new();
        for (dir, info) in &images {
            let pulled = self.root_hex(info);
            let (disk_size, shared_size) = match &pulled {
                Some(_) => {
                    let mut size = 0;
                    let mut shared = 0;
                    for l in info.layers.iter().collect::<BTreeSet<_>>() {
                        let bytes = scan.layers.get(hex_of(l)).map_or(0, |e| e.size);
                        size += bytes;
                        if users.get(hex_of(l)).copied().unwrap_or(0) > 1 {
                            shared += bytes;
                        }
                    }
                    (size, shared)
                }
                None => (info.size, 0),
            };
            let image_dir = info.rootfs.parent().unwrap_or(dir.as_path());
            let last_used_ms = mtime_ms(&image_dir.join(PIN));
            out.push(ImageStatus {
                info: info.clone(),
                disk_size,
                shared_size,
                last_used_ms,
                in_use: pinned(image_dir),
            });
        }
        Ok(out)
    }

    /// The layers of image `name`, bottom first, with sizes and the images made of each.
    pub fn layers_of(&self, name: &str) -> Result<Vec<CachedLayer>> {
        let info = self.get(name)?;
        let images = self.list()?;
        let mut out = Vec::new();
        for digest in &info.layers {
            let hex = hex_of(digest);
            let record = self.root().join(META).join(format!("{hex}.json"));
            let size = fs::read(&record)
                .ok()
                .and_then(|b| serde_json::from_slice::<LayerRecord>(&b).ok())
                .map_or(0, |r| r.size);
            out.push(CachedLayer {
                digest: digest.clone(),
                size,
                last_used_ms: mtime_ms(&record),
                images: images
                    .iter()
                    .filter(|i| i.layers.contains(digest))
                    .map(|i| i.name.clone())
                    .collect(),
            });
        }
        Ok(out)
    }

    /// The image config of pulled image `name` (`None` for an imported image, or one pulled
    /// before configs were kept).
    pub fn config_of(&self, name: &str) -> Result<Option<serde_json::Value>> {
        let info = self.get(name)?;
        let Some(dir) = info.rootfs.parent() else {
            return Ok(None);
        };
        match fs::read(dir.join(CONFIG_JSON)) {
            Ok(b) => serde_json::from_slice(&b).map(Some).map_err(|e| {
                ImageError::new(
                    ErrorKind::Unavailable,
                    format!("{}: {e}", dir.join(CONFIG_JSON).display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ImageError::io(dir.join(CONFIG_JSON).display(), e)),
        }
    }

    /// Bytes the cache of pulled images holds (its layers' file content).
    pub fn cache_bytes(&self) -> Result<u64> {
        Ok(self.scan(&self.named()?)?.bytes())
    }

    /// Evicts least recently used pulled images not in use, then the layers no remaining
    /// image is made of, until the cache holds at most `quota` bytes (layers no image uses
    /// go first, least recently used first). With `wait`, waits for pulls in progress; else
    /// returns `None` when one runs (it evicts when it ends).
    pub fn evict(&self, quota: u64, wait: bool) -> Result<Option<Removed>> {
        self.evict_to(quota, wait, false)
    }

    /// [`ImageStore::evict`], or with `dry_run` only what it would remove.
    pub fn evict_to(&self, quota: u64, wait: bool, dry_run: bool) -> Result<Option<Removed>> {
        let Some(_lock) = CacheLock::exclusive(self.root(), wait)? else {
            return Ok(None);
        };
        let images = self.named()?;
        let mut scan = self.scan(&images)?;
        let mut out = Removed::default();
        let mut bytes = scan.bytes();
        let trash = Staging::create(&self.root().join(TMP), "evict", 0o700)?;
        let mut refs = scan.refcounts();
        let mut free: Vec<(u64, String)> = scan
            .layers
            .iter()
            .filter(|(h, _)| !refs.contains_key(*h))
            .map(|(h, l)| (l.last_used, h.clone()))
            .collect();
        free.sort();
        for (_, hex) in free {
            if bytes <= quota {
                break;
            }
            bytes -= self.remove_layer(&trash, &mut scan, &hex, &mut out, dry_run)?;
        }
        let mut lru: Vec<(u64, String)> = scan
            .roots
            .iter()
            .map(|(h, r)| (r.last_used, h.clone()))
            .collect();
        lru.sort();
        for (_, hex) in lru {
            if bytes <= quota {
                break;
            }
            let Some(layers) = self.remove_root(&trash, &mut scan, &hex, &mut out, dry_run)? else {
                continue;
            };
            for l in layers.iter().collect::<BTreeSet<_>>() {
                let h = hex_of(l).to_string();
                let n = refs.entry(h.clone()).or_insert(1);
                *n -= 1;
                if *n == 0 {
                    bytes -= self.remove_layer(&trash, &mut scan, &h, &mut out, dry_run)?;
                }
            }
        }
        out.cache_bytes = bytes;
        if !dry_run {
            self.clear_stale_records(&scan);
        }
        Ok(Some(out))
    }

    /// Removes pulled images' roots that no name refers to and layers no remaining root is
    /// made of; with `all`, also every pulled image not in use (imported images stay: nothing
    /// could bring them back). With `dry_run`, only says what it would remove. Waits for
    /// pulls in progress.
    pub fn prune(&self, all: bool, dry_run: bool) -> Result<Removed> {
        let _lock = CacheLock::exclusive(self.root(), true)?;
        let images = self.named()?;
        let mut scan = self.scan(&images)?;
        let mut out = Removed::default();
        let trash = Staging::create(&self.root().join(TMP), "prune", 0o700)?;
        let hexes: Vec<String> = scan.roots.keys().cloned().collect();
        for hex in hexes {
            if all || scan.roots[&hex].names.is_empty() {
                self.remove_root(&trash, &mut scan, &hex, &mut out, dry_run)?;
            }
        }
        let refs = scan.refcounts();
        let free: Vec<String> = scan
            .layers
            .keys()
            .filter(|h| !refs.contains_key(*h))
            .cloned()
            .collect();
        for hex in free {
            self.remove_layer(&trash, &mut scan, &hex, &mut out, dry_run)?;
        }
        out.cache_bytes = scan.bytes();
        if !dry_run {
            self.clear_stale_records(&scan);
        }
        Ok(out)
    }

    /// Removes image `name`: refused while a job uses it. A pulled image's root and layers
    /// go too when no other image is made of them. Waits for pulls in progress.
    ///
    /// Errors: `InvalidInput` for a bad name or an image in use; `NotFound` when there is
    /// no such image.
    pub fn remove(&self, name: &str) -> Result<()> {
        crate::name::validate_name(name)?;
        let info = self.get(name).map_err(|e| match e.kind {
            ErrorKind::NotFound => {
                ImageError::not_found(format!("image {name:?} is not in the store"))
            }
            _ => e,
        })?;
        let _lock = CacheLock::exclusive(self.root(), true)?;
        let dir = self.image_dir(name);
        let image_dir = info.rootfs.parent().unwrap_or(dir.as_path()).to_path_buf();
        let Some(_claim) = claim(&image_dir)? else {
            return Err(in_use(name));
        };
        let trash = Staging::create(&self.root().join(TMP), "remove", 0o700)?;
        match fs::rename(&dir, trash.path.join("name")) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::not_found(format!(
                    "image {name:?} is not in the store"
                )))
            }
            Err(e) => return Err(ImageError::io(format!("removing image {name:?}"), e)),
        }
        let Some(hex) = self.root_hex(&info) else {
            return Ok(());
        };
        drop(_claim);
        // Its root and layers, unless another image uses them.
        let images = self.named()?;
        let mut scan = self.scan(&images)?;
        let mut out = Removed::default();
        if scan.roots.get(&hex).is_some_and(|r| r.names.is_empty()) {
            self.remove_root(&trash, &mut scan, &hex, &mut out, false)?;
        }
        let refs = scan.refcounts();
        for l in info.layers.iter().collect::<BTreeSet<_>>() {
            let h = hex_of(l).to_string();
            if !refs.contains_key(&h) && scan.layers.contains_key(&h) {
                self.remove_layer(&trash, &mut scan, &h, &mut out, false)?;
            }
        }
        Ok(())
    }

    /// Removes root `hex` (and the names that refer to it) into `trash`, unless it is in use;
    /// returns its layers, `None` when in use.
    fn remove_root(
        &self,
        trash: &Staging,
        scan: &mut Scan,
        hex: &str,
        out: &mut Removed,
        dry_run: bool,
    ) -> Result<Option<Vec<String>>> {
        let Some(root) = scan.roots.get(hex) else {
            return Ok(None);
        };
        let held = if dry_run {
            (!pinned(&root.dir)).then_some(None)
        } else {
            claim(&root.dir)?.map(Some)
        };
        if held.is_none() {
            out.in_use.push(format!("sha256:{hex}"));
            return Ok(None);
        }
        let Some(root) = scan.roots.remove(hex) else {
            return Ok(None);
        };
        for (i, (dir, name)) in root.names.iter().enumerate() {
            if !dry_run {
                move_to(trash, dir, &format!("name-{hex}-{i}"))?;
            }
            out.images.push(name.clone());
        }
        if !dry_run {
            move_to(trash, &root.dir, &format!("root-{hex}"))?;
        }
        out.roots.push(format!("sha256:{hex}"));
        Ok(Some(root.layers))
    }

    /// Removes layer `hex` into `trash`; returns the bytes it held.
    fn remove_layer(
        &self,
        trash: &Staging,
        scan: &mut Scan,
        hex: &str,
        out: &mut Removed,
        dry_run: bool,
    ) -> Result<u64> {
        let Some(layer) = scan.layers.remove(hex) else {
            return Ok(0);
        };
        if !dry_run {
            move_to(
                trash,
                &self.root().join(LAYERS).join(hex),
                &format!("layer-{hex}"),
            )?;
            let _ = fs::remove_file(self.root().join(META).join(format!("{hex}.json")));
        }
        out.layers.push(format!("sha256:{hex}"));
        out.bytes += layer.size;
        Ok(layer.size)
    }

    /// Deletes the records of layers that are gone (a crash between the two).
    fn clear_stale_records(&self, scan: &Scan) {
        let Ok(entries) = fs::read_dir(self.root().join(META)) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if !scan.layers.contains_key(hex) && !self.root().join(LAYERS).join(hex).exists() {
                let _ = fs::remove_file(e.path());
            }
        }
    }

    /// After a pull: evicts down to the quota when one is set and no other pull runs. A
    /// failure is logged, not returned: the pull itself succeeded.
    pub(crate) fn enforce_quota(&self) {
        let Some(quota) = self.quota else {
            return;
        };
        match self.evict(quota, false) {
            Ok(Some(r)) if !r.roots.is_empty() || !r.layers.is_empty() => tracing::info!(
                images = ?r.images,
                layers = r.layers.len(),
                freed = r.bytes,
                cache = r.cache_bytes,
                "image cache over its quota: evicted least recently used images"
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "image cache eviction failed"),
        }
    }
}

fn in_use(name: &str) -> ImageError {
    ImageError::invalid(format!(
        "image {name:?} is in use by a running job (or a pull); it can be removed once that ends"
    ))
}

/// Renames `path` into `trash` as `name`; a path already gone is fine.
fn move_to(trash: &Staging, path: &Path, name: &str) -> Result<()> {
    match fs::rename(path, trash.path.join(name)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io(format!("removing {}", path.display()), e)),
    }
}
