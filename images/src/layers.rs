//! The layer store: each layer of a pulled image unpacked once, into a directory named by its
//! blob digest, and each image's root assembled once from its layers, named by its manifest
//! digest.
//!
//! ```text
//! layers/<hex of the blob digest>/   one layer's entries; whiteouts kept as the .wh. files
//! roots/<hex of the manifest>/rootfs the layers stacked, whiteouts applied (read-only to jobs)
//! locks/<kind>-<hex>.lock            held while one pull makes that layer or root
//! ```
//!
//! Why a merged root rather than the layers as overlay lower directories: the sandbox mounts
//! one lower directory under the job's own layer, and idmaps it for jobs that are root inside;
//! a merged root keeps that flow as it is (one mount, one idmap), and a warm start is the same
//! single overlay mount as an imported image's. The root is made of hard links to the layers'
//! files ([`crate::stack`]), so it costs directory entries, not a copy. The layers stay the
//! unit of download and of unpacking: a second image on the same base fetches and unpacks
//! only its new layers.
//!
//! A layer is unpacked straight from the download, through the same extractor and limits as
//! an import, into a staging directory that is published by one rename only once the blob
//! hashed to its digest and the tar stream to its `diff_id`: a mismatch, a limit or a dropped
//! connection leaves nothing behind. Two pulls of one layer, in one process or two, take its
//! lock in turn; the second finds the directory made and downloads nothing.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::cache::{record_layer, same_file, touch_layer, CONFIG_JSON, LAYERS_JSON, PIN};
use crate::error::{ImageError, Result};
use crate::extract::{apply_stream, Whiteouts};
use crate::limits::Budget;
use crate::oci::{sha256_hex, Descriptor};
use crate::rootfs::RootDir;
use crate::shared::SharedCache;
use crate::source::read_blob;
use crate::stack::stack;
use crate::staging::{write_synced, Staging};
use crate::store::tree_size;

pub(crate) const LAYERS: &str = "layers";
pub(crate) const ROOTS: &str = "roots";
pub(crate) const LOCKS: &str = "locks";

/// An exclusive `flock` on a lock file, which is deleted when the lock is dropped: `locks/`
/// holds only the locks in use. Deleting is safe because it is done while holding the lock,
/// and a taker checks, once it holds its lock, that the file it locked is still the one at the
/// path; if not (its holder deleted it meanwhile), it opens the path again.
#[derive(Debug)]
pub(crate) struct Lock {
    held: File,
    path: PathBuf,
}

impl Lock {
    /// Waits for the lock `locks/<name>.lock`.
    pub fn take(store: &Path, name: &str) -> Result<Lock> {
        let path = store.join(LOCKS).join(format!("{name}.lock"));
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(|e| ImageError::io(format!("opening {}", path.display()), e))?;
            loop {
                // SAFETY: flock on a descriptor this function owns.
                if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                    break;
                }
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(ImageError::io(format!("locking {}", path.display()), err));
                }
            }
            if same_file(&file, &path) {
                return Ok(Lock { held: file, path });
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Still held: no one else can have this file at the path now.
        if same_file(&self.held, &self.path) {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// The directory of the layer with blob digest `digest`.
pub(crate) fn layer_dir(store: &Path, digest: &str) -> Result<PathBuf> {
    let hex = sha256_hex(digest).map_err(|e| ImageError::invalid(format!("layer digest {e}")))?;
    Ok(store.join(LAYERS).join(hex))
}

/// Makes sure layer `desc` (whose uncompressed content must hash to `diff_id`) is unpacked,
/// calling `open` for its blob only when it is not; returns whether this call unpacked it.
pub(crate) fn ensure_layer(
    store: &Path,
    shared: Option<&SharedCache>,
    desc: &Descriptor,
    diff_id: &str,
    budget: &mut Budget,
    open: impl FnOnce() -> Result<Box<dyn std::io::Read + Send + Sync>>,
) -> Result<bool> {
    let dest = layer_dir(store, &desc.digest)?;
    let hex = sha256_hex(&desc.digest).map_err(ImageError::invalid)?;
    if dest.is_dir() {
        touch_layer(store, hex);
        return Ok(false);
    }
    let _lock = Lock::take(store, &format!("layer-{hex}"))?;
    if dest.is_dir() {
        touch_layer(store, hex);
        return Ok(false);
    }
    if let Some(cache) = shared {
        let mut spent = budget.clone();
        match cache.copy_out(hex, &store.join(crate::store::TMP), &mut spent) {
            Ok(Some(staging)) => {
                let size = tree_size(&staging.path)?;
                staging.publish(&dest)?;
                record_layer(store, hex, size)?;
                *budget = spent;
                tracing::debug!(layer = %desc.digest, cache = %cache.root().display(), "layer taken from the shared cache");
                return Ok(false);
            }
            Ok(None) => {}
            // A cache that fails (unreachable storage, a limit) costs a download, not the pull.
            Err(e) => {
                tracing::warn!(layer = %desc.digest, error = %e, "cannot copy a layer from the shared cache; downloading it")
            }
        }
    }
    let staging = Staging::create(&store.join(crate::store::TMP), "layer", 0o755)?;
    let root = RootDir::open(&staging.path)?;
    let diff = read_blob(open()?, desc, budget, |s, b| {
        apply_stream(&root, s, Whiteouts::Literal, b)
    })?;
    if diff != diff_id {
        return Err(ImageError::invalid(format!(
            "layer {}: its uncompressed content hashes to {diff}, but the image config's \
             diff_id for it is {diff_id}; the image is corrupt or was tampered with",
            desc.digest
        )));
    }
    root.sync()?;
    drop(root);
    let size = tree_size(&staging.path)?;
    staging.publish(&dest)?;
    // After the layer: a crash between the two leaves a layer measured again when needed.
    record_layer(store, hex, size)?;
    if let Some(cache) = shared {
        // Verified above (blob digest and diff_id): other nodes may take it as it is.
        let mut fresh = Budget::new(*budget.limits());
        match cache.publish(hex, &dest, size, &mut fresh) {
            Ok(true) => cache.enforce_quota(),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(layer = %desc.digest, error = %e, "cannot publish a layer to the shared cache")
            }
        }
    }
    Ok(true)
}

/// What a root is made of: its layers (blob digests and directories, bottom first) and the
/// image config's bytes.
#[derive(Debug)]
pub(crate) struct RootParts<'a> {
    pub digests: &'a [String],
    pub dirs: &'a [PathBuf],
    pub config: &'a [u8],
}

/// Makes sure the root of the image with manifest digest `digest`, stacked from `parts`,
/// exists, with its pin file, layer list and config beside it; returns its path.
pub(crate) fn ensure_root(store: &Path, digest: &str, parts: &RootParts<'_>) -> Result<PathBuf> {
    let layers = parts.dirs;
    let hex = sha256_hex(digest).map_err(|e| ImageError::invalid(format!("image digest {e}")))?;
    let dest = store.join(ROOTS).join(hex);
    let rootfs = dest.join("rootfs");
    if rootfs.is_dir() {
        return Ok(rootfs);
    }
    let _lock = Lock::take(store, &format!("root-{hex}"))?;
    if rootfs.is_dir() {
        return Ok(rootfs);
    }
    let staging = Staging::create(&store.join(crate::store::TMP), "root", 0o700)?;
    let tree = staging.path.join("rootfs");
    DirBuilder::new()
        .mode(0o755)
        .create(&tree)
        .and_then(|()| fs::set_permissions(&tree, fs::Permissions::from_mode(0o755)))
        .map_err(|e| ImageError::io(format!("creating {}", tree.display()), e))?;
    stack(&tree, layers)?;
    let root = RootDir::open(&tree)?;
    root.ensure_mount_points()?;
    root.sync()?;
    drop(root);
    let list = serde_json::to_vec(parts.digests)
        .map_err(|e| ImageError::invalid(format!("encoding the layer list: {e}")))?;
    write_synced(&staging.path.join(LAYERS_JSON), &list)?;
    write_synced(&staging.path.join(CONFIG_JSON), parts.config)?;
    write_synced(&staging.path.join(PIN), b"")?;
    staging.publish(&dest)?;
    Ok(rootfs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn locks_exclude_each_other_and_leave_no_file_behind() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join(LOCKS)).unwrap();
        let store = tmp.path().to_path_buf();
        let inside = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (store, inside) = (store.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let lock = Lock::take(&store, "layer-x").unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        std::thread::yield_now();
                        inside.store(false, Ordering::SeqCst);
                        drop(lock);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let left: Vec<_> = fs::read_dir(store.join(LOCKS)).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
