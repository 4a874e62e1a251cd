//! A cluster-wide layer cache on shared storage (`[images] shared_cache`): a node looks there
//! for a layer before downloading it, and publishes each layer it unpacked there, so a second
//! node reuses what the first one fetched.
//!
//! ```text
//! <cache>/layers/<hex of the blob digest>/   one layer's entries, as in a node's store
//! <cache>/tmp/                               layers being copied in (renamed into layers/)
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
use crate::staging::Staging;

const LAYERS: &str = "layers";
const TMP: &str = "tmp";
/// A staging directory left in `tmp/` this long (a node that crashed mid-copy) is removed.
const STALE: Duration = Duration::from_secs(24 * 3600);

/// A shared layer cache, checked at open. Cheap to clone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedCache {
    root: PathBuf,
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
        for sub in [LAYERS, TMP] {
            let dir = root.join(sub);
            mkdir(&dir)?;
            check_dir(&dir)?;
        }
        let cache = SharedCache {
            root: root.to_path_buf(),
        };
        cache.clear_stale();
        Ok(cache)
    }

    /// The cache's directory.
    pub fn root(&self) -> &Path {
        &self.root
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
    /// store's), counting against `budget`; `None` when the cache does not hold it.
    pub(crate) fn copy_out(
        &self,
        hex: &str,
        tmp: &Path,
        budget: &mut Budget,
    ) -> Result<Option<Staging>> {
        let Some(dir) = self.layer(hex) else {
            return Ok(None);
        };
        let staging = Staging::create(tmp, "layer", 0o755)?;
        copy_tree(&dir, &staging.path, budget)?;
        Ok(Some(staging))
    }

    /// Publishes the node's unpacked layer `hex` at `from` in the cache, unless it holds it
    /// already (another node's copy, made at the same time, wins).
    pub(crate) fn publish(&self, hex: &str, from: &Path, budget: &mut Budget) -> Result<()> {
        let dest = self.root.join(LAYERS).join(hex);
        if dest.exists() {
            return Ok(());
        }
        let staging = Staging::create(&self.root.join(TMP), "layer", 0o700)?;
        copy_tree(from, &staging.path, budget)?;
        match fs::rename(&staging.path, &dest) {
            Ok(()) => Ok(()),
            // Another node's copy came first: the same layer, verified by it.
            Err(_) if dest.is_dir() => Ok(()),
            Err(e) => Err(ImageError::io(format!("publishing {}", dest.display()), e)),
        }
    }

    /// Removes staging directories older than [`STALE`] (their node crashed mid-copy; a live
    /// copy is never that old).
    fn clear_stale(&self) {
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
