//! A cluster-wide layer cache on shared storage (`[images] shared_cache`): a node looks there
//! for a layer before downloading it, and publishes each layer it unpacked there, so a second
//! node reuses what the first one fetched.
//!
//! ```text
//! <cache>/layers/<hex of the blob digest>/   one layer's entries, as in a node's store
//! <cache>/tmp/                               layers being copied in (renamed into layers/)
//! <cache>/meta/, leases/, evict.lock         the quota's records (see `shared_quota.rs`)
//! ```
//!
//! Trust: a directory under `layers/` is taken as the layer its name says, unchecked (its
//! tar stream is gone, so its diff_id cannot be verified again): only root may have made it.
//! So the cache, `layers/`, `tmp/` and every layer directory must be real directories (not
//! symlinks) owned by the agent's own user (root on a node) with no access at all for group
//! and others, and no directory above the cache may be writable by others unless it is
//! sticky. No access rather than just no write: layers hold world-writable directories (an
//! image's `/tmp`) that any user who could reach them could write into. A node that finds the
//! cache otherwise refuses to start, naming the path and what is wrong; a layer directory
//! that fails the checks is ignored (downloaded instead). Only layers this node verified (blob
//! digest and diff_id) are published.
//!
//! Copies in both directions go through the same extractor and limits as an import (the
//! source tree is archived on the fly and unpacked into a staging directory that is renamed
//! into place), so even a tampered cache cannot write outside the layer being made.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::dirsource::with_tar_stream;
use crate::error::{ErrorKind, ImageError, Result};
use crate::extract::{apply_stream, Whiteouts};
use crate::limits::Budget;
use crate::rootfs::RootDir;
use crate::shared_quota::{self, identity, touch_record, write_record, Lease, LEASES, META};
use crate::staging::Staging;
use crate::Removed;

pub(crate) const LAYERS: &str = "layers";
pub(crate) const TMP: &str = "tmp";
/// A staging directory left in `tmp/` this long (a node that crashed mid-copy) is removed.
const STALE: Duration = Duration::from_secs(24 * 3600);

/// A shared layer cache, checked at open. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCache {
    root: PathBuf,
    /// Most bytes of layer content it may hold (`[images] shared_cache_quota`).
    quota: Option<u64>,
}

impl SharedCache {
    /// Opens (creating if missing, mode 0700) the cache at `root` and checks it as the module
    /// docs say.
    ///
    /// Errors: `PermissionDenied` naming the path and the problem (a symlink, another owner,
    /// access for group or others, an ancestor others may write to); `InvalidInput` for a
    /// relative path; `Unavailable` when it cannot be created or read.
    pub fn open(root: &Path) -> Result<SharedCache> {
        if !root.is_absolute() {
            return Err(ImageError::invalid(format!(
                "shared_cache {:?} must be an absolute path",
                root.display()
            )));
        }
        mkdir(root)?;
        check_dir(root)?;
        let mut above = root.parent();
        while let Some(dir) = above {
            check_ancestor(dir, root)?;
            above = dir.parent();
        }
        for sub in [LAYERS, TMP, META, LEASES] {
            let dir = root.join(sub);
            mkdir(&dir)?;
            check_dir(&dir)?;
        }
        let cache = SharedCache {
            root: root.to_path_buf(),
            quota: None,
        };
        cache.clear_stale();
        Ok(cache)
    }

    /// This cache with `quota` bytes for its layers' content: each node that adds a layer
    /// then evicts the least recently used layers no node is copying until it fits.
    pub fn with_quota(mut self, quota: Option<u64>) -> SharedCache {
        self.quota = quota;
        self
    }

    /// The quota, bytes.
    pub fn quota(&self) -> Option<u64> {
        self.quota
    }

    /// The cache's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Bytes of file content its layers hold.
    pub fn bytes(&self) -> Result<u64> {
        Ok(shared_quota::scan(&self.root, shared_quota::now_ms())?
            .iter()
            .map(|l| l.size)
            .sum())
    }

    /// Evicts the least recently used layers that no node is copying out now until the
    /// cache holds at most `quota` bytes (the module docs of `shared_quota.rs` say how nodes
    /// agree on that); with `dry_run`, only says which would go. `None` when another node's
    /// eviction runs now. Only `layers`, `bytes`, `cache_bytes` and `in_use` (layers kept
    /// because a node is copying them) are filled in.
    ///
    /// Errors: `Unavailable` when the cache cannot be read or a layer cannot be moved.
    pub fn evict(&self, quota: u64, dry_run: bool) -> Result<Option<Removed>> {
        shared_quota::evict(&self.root, quota, dry_run)
    }

    /// After this node added a layer: evicts down to the quota when one is set. A failure
    /// is logged, not returned: the pull itself succeeded.
    pub(crate) fn enforce_quota(&self) {
        let Some(quota) = self.quota else {
            return;
        };
        match self.evict(quota, false) {
            Ok(Some(r)) if !r.layers.is_empty() => tracing::info!(
                cache = %self.root.display(),
                layers = r.layers.len(),
                freed = r.bytes,
                bytes = r.cache_bytes,
                "shared layer cache over its quota: evicted least recently used layers"
            ),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(cache = %self.root.display(), error = %e, "shared layer cache eviction failed")
            }
        }
    }

    /// The directory of layer `hex` in the cache, when it holds one that passes the checks.
    pub fn layer(&self, hex: &str) -> Option<PathBuf> {
        let dir = self.root.join(LAYERS).join(hex);
        match check_dir(&dir) {
            Ok(()) => Some(dir),
            Err(e) if e.kind == ErrorKind::NotFound => None,
            Err(e) => {
                tracing::warn!(layer = hex, error = %e, "ignoring a layer of the shared cache");
                None
            }
        }
    }

    /// Copies layer `hex` from the cache into a new staging directory under `tmp` (the node
    /// store's), counting against `budget`; `None` when the cache does not hold it. The copy
    /// holds a lease on the layer, and is refused (`Unavailable`) when the layer was evicted
    /// while it ran: the caller downloads it instead.
    pub(crate) fn copy_out(
        &self,
        hex: &str,
        tmp: &Path,
        budget: &mut Budget,
    ) -> Result<Option<Staging>> {
        self.copy_out_then(hex, tmp, budget, || {})
    }

    /// [`SharedCache::copy_out`], calling `copied` between the copy and its check (tests
    /// evict there).
    pub(crate) fn copy_out_then(
        &self,
        hex: &str,
        tmp: &Path,
        budget: &mut Budget,
        copied: impl FnOnce(),
    ) -> Result<Option<Staging>> {
        // A miss costs no lease; a hit takes one and looks again, so an eviction that
        // starts after that look sees the lease.
        if self.layer(hex).is_none() {
            return Ok(None);
        }
        let _lease = Lease::take(&self.root, hex)?;
        let Some(dir) = self.layer(hex) else {
            return Ok(None);
        };
        let before = identity(&dir);
        // Read before the copy: an eviction removes the record with the layer.
        let recorded = shared_quota::recorded_size(&self.root, hex);
        let staging = Staging::create(tmp, "layer", 0o755)?;
        copy_tree(&dir, &staging.path, budget)?;
        copied();
        // An eviction renames a layer away before deleting it: a source still at its path
        // as the same directory was whole for the whole copy. Where the storage's attribute
        // cache hides that (NFS), a copy with less content than its publisher recorded lost
        // part of its source to an eviction all the same. (More is no sign: hard links come
        // out of a copy as files of their own.)
        let short = match recorded {
            Some(want) => crate::store::tree_size(&staging.path)? < want,
            None => false,
        };
        if before.is_none() || identity(&dir) != before || short {
            return Err(ImageError::new(
                ErrorKind::Unavailable,
                format!(
                    "layer {hex} was evicted from the shared cache {} while being copied",
                    self.root.display()
                ),
            ));
        }
        touch_record(&self.root, hex);
        Ok(Some(staging))
    }

    /// Publishes the node's unpacked layer `hex` at `from` (`size` bytes of file content) in
    /// the cache, unless it holds it already (another node's copy, made at the same time,
    /// wins); returns whether this call added it.
    pub(crate) fn publish(
        &self,
        hex: &str,
        from: &Path,
        size: u64,
        budget: &mut Budget,
    ) -> Result<bool> {
        let dest = self.root.join(LAYERS).join(hex);
        if dest.exists() {
            return Ok(false);
        }
        let staging = Staging::create(&self.root.join(TMP), "layer", 0o700)?;
        copy_tree(from, &staging.path, budget)?;
        match fs::rename(&staging.path, &dest) {
            Ok(()) => {}
            // Another node's copy came first: the same layer, verified by it.
            Err(_) if dest.is_dir() => return Ok(false),
            Err(e) => return Err(ImageError::io(format!("publishing {}", dest.display()), e)),
        }
        // After the layer: one without a record is measured by the next eviction.
        write_record(&self.root, hex, size, SystemTime::now())?;
        Ok(true)
    }

    /// Removes staging directories older than [`STALE`] (their node crashed mid-copy; a live
    /// copy is never that old), and expired leases.
    fn clear_stale(&self) {
        shared_quota::clear_expired_leases(&self.root);
        let Ok(entries) = fs::read_dir(self.root.join(TMP)) else {
            return;
        };
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok())
                .is_some_and(|age| age > STALE);
            if old {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Unpacks the tree at `from` into the empty directory `to` through the extractor.
fn copy_tree(from: &Path, to: &Path, budget: &mut Budget) -> Result<()> {
    let root = RootDir::open(to)?;
    with_tar_stream(from, |stream| {
        apply_stream(&root, stream, Whiteouts::Literal, budget)
    })?;
    root.sync()
}

fn mkdir(dir: &Path) -> Result<()> {
    match DirBuilder::new().recursive(false).mode(0o700).create(dir) {
        Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| ImageError::io(format!("creating {}", dir.display()), e)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(ImageError::io(
            format!("creating the shared cache directory {}", dir.display()),
            e,
        )),
    }
}

fn refuse(dir: &Path, why: &str) -> ImageError {
    ImageError::new(
        ErrorKind::PermissionDenied,
        format!("shared cache {}: {why}", dir.display()),
    )
}

/// `dir` is a directory, not a symlink, owned by this process's user, with no access for
/// group or others.
fn check_dir(dir: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dir).map_err(|e| ImageError::io(dir.display(), e))?;
    if meta.file_type().is_symlink() {
        return Err(refuse(dir, "is a symlink; name the real directory"));
    }
    if !meta.is_dir() {
        return Err(refuse(dir, "is not a directory"));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(refuse(
            dir,
            &format!(
                "is owned by uid {}, not by uid {me} (root on a node): only root may make the \
                 layers nodes trust (on NFS, export it without root squashing)",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(refuse(
            dir,
            &format!("is writable by non-root users (mode {mode:o}); make it 0700"),
        ));
    }
    if mode & 0o077 != 0 {
        return Err(refuse(
            dir,
            &format!(
                "is open to group or others (mode {mode:o}); make it 0700: layers hold \
                 world-writable directories that users could write into"
            ),
        ));
    }
    Ok(())
}

/// An ancestor of the cache may not let others replace the cache: no write for group or
/// others unless sticky, and owned by root or this process's user.
fn check_ancestor(dir: &Path, cache: &Path) -> Result<()> {
    let meta = fs::metadata(dir).map_err(|e| ImageError::io(dir.display(), e))?;
    let me = nix::unistd::geteuid().as_raw();
    let mode = meta.mode();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(refuse(
            cache,
            &format!(
                "{} above it is owned by uid {}, who could replace the cache",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(refuse(
            cache,
            &format!(
                "{} above it is writable by non-root users (mode {:o}), who could replace the \
                 cache",
                dir.display(),
                mode & 0o7777
            ),
        ));
    }
    Ok(())
}
