//! The store: imported images on disk, each replaced or removed whole.
//!
//! Layout under the root:
//!
//! ```text
//! images/<sha256 of name>/image.json   ImageInfo as JSON
//! images/<sha256 of name>/rootfs/      the unpacked root filesystem
//! layers/, roots/, meta/, locks/       pulled images' layers and roots (see `layers.rs`,
//!                                      `cache.rs`)
//! tmp/                                 imports in progress and removals
//! ```
//!
//! The root, `images/`, `tmp/` and every image directory are 0700 and owned by the store's
//! owner (root on a node), whatever the umask: an image holds files that are setuid root on
//! the host (its `/usr/bin/sudo`, say), and a path to them that any local user could walk
//! would let that user run them on the host as root. Jobs never walk these paths: the shim,
//! as real root, mounts an image's `rootfs/` as the lower layer of the job's overlay, and the
//! job sees only the mount. Opening a store fixes the modes of one made by older versions.
//!
//! An import unpacks into a fresh directory under `tmp/`, then renames it into `images/`
//! (atomically exchanging it with the previous image of that name), so readers see the old
//! image or the new one, never a mix; on any error the directory is deleted and the store is
//! as it was.

use std::ffi::{OsStr, OsString};
use std::fs::{self, DirBuilder};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{fchmod, fstat, Mode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::META;
use crate::error::{ErrorKind, ImageError, Result};
use crate::fsutil::{list_dir, open_dir_nofollow, owned, spread_subdirs};
use crate::layers::{LAYERS, LOCKS, ROOTS};
use crate::limits::{Budget, Limits};
use crate::name::validate_name;
use crate::rootfs::RootDir;
use crate::source::Source;
use crate::staging::{clear_stale, write_synced, Staging};

const IMAGES: &str = "images";
pub(crate) const TMP: &str = "tmp";
const INFO: &str = "image.json";
const ROOTFS: &str = "rootfs";
/// Mode of the store's own directories: its owner's alone.
const PRIVATE: u32 = 0o700;

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInfo {
    /// The name it was imported under.
    pub name: String,
    /// `sha256:<hex>`: of the uncompressed tar stream for a tarball or directory import, of
    /// the manifest for an OCI layout.
    pub digest: String,
    /// `"tarball"`, `"directory"` or `"oci-layout"`.
    pub source: String,
    /// Bytes of regular-file content in the unpacked root (hard links counted once).
    pub size: u64,
    /// When the import finished, in milliseconds since the Unix epoch.
    pub created_ms: u64,
    /// The unpacked root filesystem, to be mounted read-only by the sandbox.
    pub rootfs: PathBuf,
    /// For a pulled image: its layers' blob digests, bottom first (shared in `layers/`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// For a pulled image: credentials had to be sent to pull it. A node serves it to a job
    /// only once that job's credentials prove access to the same digest
    /// ([`crate::check_access`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub private: bool,
}

/// A directory of imported images. Cheap to clone; clones share the directory.
///
/// ```no_run
/// use std::path::{Path, PathBuf};
/// use wharf_images::ImageStore;
///
/// let store = ImageStore::open(PathBuf::from("/var/lib/wharf/images"))?;
/// let info = store.import(Path::new("/srv/ubuntu-24.04.tar.zst"), "ubuntu:24.04")?;
/// assert_eq!(store.get("ubuntu:24.04")?.rootfs, info.rootfs);
/// # Ok::<(), wharf_images::ImageError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ImageStore {
    root: PathBuf,
    limits: Limits,
    /// [`ImageStore::names`]'s last answer, keyed by the image directories it was read from.
    names: Arc<Mutex<(Vec<OsString>, Vec<String>)>>,
    /// Bytes pulled images' layers may take (`[images] cache_quota`); `None`: no limit.
    pub(crate) quota: Option<u64>,
    /// The cluster-wide layer cache pulls look in first and publish to
    /// (`[images] shared_cache`).
    pub(crate) shared: Option<crate::shared::SharedCache>,
}

impl ImageStore {
    /// Opens the store at `root`, creating it if missing, with default [`Limits`]; makes the
    /// root, `images/`, `tmp/` and every image directory 0700 (see the module docs), and any
    /// missing directory above the root 0755 (it is shared with what jobs must reach). Also
    /// clears leftovers of imports whose process is gone.
    ///
    /// Errors: `PermissionDenied` when the directories cannot be created or the store belongs
    /// to another user (a node's store is root's: run as root); `Unavailable` otherwise.
    pub fn open(root: PathBuf) -> Result<ImageStore> {
        if let Some(parent) = root.parent() {
            make_public_parents(parent).map_err(|e| not_allowed(&root, e))?;
        }
        // Only the store's own directories are private; an existing one is corrected below.
        let mkdir = |path: &Path| match DirBuilder::new().mode(PRIVATE).create(path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                Err(ImageError::io(format!("creating {}", path.display()), e))
            }
            _ => Ok(()),
        };
        mkdir(&root).map_err(|e| not_allowed(&root, e))?;
        let fd = open_own(&root)?;
        for sub in [IMAGES, TMP, LAYERS, ROOTS, LOCKS, META] {
            mkdir(&root.join(sub))?;
        }
        lock_down(&root, &fd)?;
        if let Ok(tmp) = open_dir_nofollow(fd.as_raw_fd(), OsStr::new(TMP)) {
            spread_subdirs(&tmp);
        }
        let store = ImageStore {
            root,
            limits: Limits::default(),
            names: Arc::default(),
            quota: None,
            shared: None,
        };
        clear_stale(&store.root.join(TMP));
        Ok(store)
    }

    /// This store with the shared layer cache `shared` for its pulls (see
    /// [`crate::SharedCache`]).
    pub fn with_shared_cache(mut self, shared: Option<crate::SharedCache>) -> ImageStore {
        self.shared = shared;
        self
    }

    /// This store with `limits` for later imports.
    pub fn with_limits(mut self, limits: Limits) -> ImageStore {
        self.limits = limits;
        self
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory that holds one directory per image, each published into it by one
    /// rename and removed from it whole: watching it tells when the names may have changed.
    pub fn images_dir(&self) -> PathBuf {
        self.root.join(IMAGES)
    }

    /// The limits imports run under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Imports `source` under `name`, replacing any image of that name only on success, and
    /// never an imported image a job is using (refused: it is that job's root).
    ///
    /// `source` is a rootfs tarball (plain, gzip or zstd, told by magic bytes), a directory
    /// holding a root filesystem, or an OCI image layout (`DIR`, or `DIR:TAG` to pick the
    /// manifest annotated `org.opencontainers.image.ref.name = TAG`). Every path is written
    /// inside the new root (see the crate docs); devices, FIFOs and sockets are skipped; the
    /// mount points `proc sys dev tmp etc` are created when missing.
    ///
    /// Errors: `InvalidInput` for a bad name, a malformed, corrupt or hostile source or one
    /// over the [`Limits`], or an image of that name in use; `NotFound` for a missing source,
    /// tag or blob; `PermissionDenied` and `Unavailable` from the filesystem. The store is
    /// unchanged after any error.
    pub fn import(&self, source: &Path, name: &str) -> Result<ImageInfo> {
        validate_name(name)?;
        let source = Source::classify(source)?;
        let staging = Staging::create(&self.root.join(TMP), "import", PRIVATE)?;
        let rootfs = staging.path.join(ROOTFS);
        // The image's `/`: 0755 whatever the umask, unless the image says otherwise.
        DirBuilder::new()
            .mode(0o755)
            .create(&rootfs)
            .and_then(|()| fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755)))
            .map_err(|e| ImageError::io(format!("creating {}", rootfs.display()), e))?;
        let root = RootDir::open(&rootfs)?;
        let mut budget = Budget::new(self.limits);
        let digest = source.unpack(&root, &mut budget)?;
        root.ensure_mount_points()?;
        // Durable before listed: a crash must not leave an image of empty files behind.
        root.sync()?;
        drop(root);

        let dest = self.image_dir(name);
        let info = ImageInfo {
            name: name.to_string(),
            digest,
            source: source.kind().to_string(),
            size: tree_size(&rootfs)?,
            created_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            rootfs: dest.join(ROOTFS),
            layers: vec![],
            private: false,
        };
        let json = serde_json::to_vec_pretty(&info).map_err(|e| {
            ImageError::new(ErrorKind::Unavailable, format!("encoding image info: {e}"))
        })?;
        write_synced(&staging.path.join(INFO), &json)?;
        // An imported image of that name holds its root in place: replacing it under a
        // running job would delete the job's root, so a root in use is refused, and one that
        // is not stays claimed until it has been swapped out (a job pinning it meanwhile finds
        // it gone rather than half-deleted).
        let _claim = match read_info(&dest.join(INFO)) {
            Ok(old) if old.rootfs.parent() == Some(dest.as_path()) => {
                match crate::cache::claim(&dest)? {
                    Some(claim) => Some(claim),
                    None => {
                        return Err(ImageError::invalid(format!(
                            "image {name:?} is in use by a running job (or a pull); import \
                             the new one under another name, or again once that ends"
                        )))
                    }
                }
            }
            _ => None,
        };
        staging.publish(&dest)?;
        Ok(info)
    }

    /// The images' names, sorted, as [`ImageStore::list`] gives them, but cheap to ask often
    /// (the agent does, at every poll and every change of its jobs): the image directories are named by a hash of the
    /// image's name and published whole by one rename, so while their list is unchanged so
    /// are the names, and no `image.json` is read again.
    pub fn names(&self) -> Result<Vec<String>> {
        let dir = self.root.join(IMAGES);
        let mut dirs = fs::read_dir(&dir)
            .map_err(|e| ImageError::io(dir.display(), e))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| ImageError::io(dir.display(), e))?;
        dirs.sort();
        let mut cache = self
            .names
            .lock()
            .map_err(|_| ImageError::new(ErrorKind::Unavailable, "image name cache poisoned"))?;
        if cache.0 != dirs {
            let names = self.list()?.into_iter().map(|i| i.name).collect();
            *cache = (dirs, names);
        }
        Ok(cache.1.clone())
    }

    /// All images, sorted by name. Entries whose `image.json` is unreadable are left out.
    pub fn list(&self) -> Result<Vec<ImageInfo>> {
        let dir = self.root.join(IMAGES);
        let entries = fs::read_dir(&dir).map_err(|e| ImageError::io(dir.display(), e))?;
        let mut images = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io(dir.display(), e))?;
            if let Ok(info) = read_info(&entry.path().join(INFO)) {
                images.push(info);
            }
        }
        images.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(images)
    }

    /// The image called `name`.
    ///
    /// Errors: `InvalidInput` for a bad name; `NotFound`, saying how to import it.
    pub fn get(&self, name: &str) -> Result<ImageInfo> {
        validate_name(name)?;
        match read_info(&self.image_dir(name).join(INFO)) {
            Err(e) if e.kind == ErrorKind::NotFound => Err(ImageError::not_found(format!(
                "image {name:?} is not in the store at {}; import it first with \
                 `wharf image import SOURCE --name {name}` (SOURCE: a rootfs tarball, a \
                 root filesystem directory or an OCI layout DIR[:TAG])",
                self.root.display()
            ))),
            other => other,
        }
    }

    /// Names the pulled root `rootfs` (of manifest `digest`, made of `layers`) `name`,
    /// replacing any image of that name.
    pub(crate) fn publish_pulled(
        &self,
        name: &str,
        digest: String,
        rootfs: PathBuf,
        layers: Vec<String>,
        private: bool,
    ) -> Result<ImageInfo> {
        let staging = Staging::create(&self.root.join(TMP), "pull", PRIVATE)?;
        let info = ImageInfo {
            name: name.to_string(),
            digest,
            source: "registry".into(),
            size: tree_size(&rootfs)?,
            created_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            rootfs,
            layers,
            private,
        };
        let json = serde_json::to_vec_pretty(&info).map_err(|e| {
            ImageError::new(ErrorKind::Unavailable, format!("encoding image info: {e}"))
        })?;
        write_synced(&staging.path.join(INFO), &json)?;
        staging.publish(&self.image_dir(name))?;
        Ok(info)
    }

    /// The directory of the image called `name` under `images/`.
    pub(crate) fn image_dir(&self, name: &str) -> PathBuf {
        self.root
            .join(IMAGES)
            .join(hex::encode(Sha256::digest(name.as_bytes())))
    }
}

/// Mode of the missing directories above the store that opening it creates (`/var/lib/wharf`
/// on a node): other directories live there too (the agent's job roots) that jobs must pass
/// through, so they stay traversable by everyone.
const PUBLIC_PARENT: u32 = 0o755;

/// Creates the missing directories of `dir`, each exactly [`PUBLIC_PARENT`] whatever the umask.
/// Directories that exist are left as they are: their modes are their owner's choice.
fn make_public_parents(dir: &Path) -> Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && fs::symlink_metadata(p).is_err())
        .collect();
    for path in missing.into_iter().rev() {
        match DirBuilder::new().mode(PUBLIC_PARENT).create(path) {
            Ok(()) => fs::set_permissions(path, fs::Permissions::from_mode(PUBLIC_PARENT))
                .map_err(|e| ImageError::io(format!("chmod {}", path.display()), e))?,
            // Made meanwhile by someone else: theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(ImageError::io(format!("creating {}", path.display()), e)),
        }
    }
    Ok(())
}

/// Opens the store's root, checking that this process's user owns it.
fn open_own(root: &Path) -> Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let fd = match nix::fcntl::open(root, flags, Mode::empty()) {
        Ok(fd) => owned(fd),
        Err(Errno::EACCES) => return Err(not_owner(root, None)),
        Err(e) => return Err(ImageError::sys(format!("opening {}", root.display()), e)),
    };
    let st = fstat(fd.as_raw_fd()).map_err(|e| ImageError::sys(root.display(), e))?;
    if st.st_uid != nix::unistd::geteuid().as_raw() {
        return Err(not_owner(root, Some(st.st_uid)));
    }
    Ok(fd)
}

/// Makes the store's directories [`PRIVATE`], through descriptors from the root `fd` (a
/// symlink planted inside is refused, not followed).
fn lock_down(root: &Path, fd: &OwnedFd) -> Result<()> {
    let private = |fd: &OwnedFd, what: &dyn std::fmt::Display| -> Result<()> {
        let st = fstat(fd.as_raw_fd()).map_err(|e| ImageError::sys(what, e))?;
        if st.st_mode & 0o7777 == PRIVATE {
            return Ok(());
        }
        fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(PRIVATE))
            .map_err(|e| ImageError::sys(format!("making {what} private (0700)"), e))
    };
    private(fd, &root.display())?;
    for sub in [TMP, IMAGES, LAYERS, ROOTS, LOCKS, META] {
        let path = root.join(sub);
        let dir = open_dir_nofollow(fd.as_raw_fd(), OsStr::new(sub))
            .map_err(|e| ImageError::sys(format!("opening {}", path.display()), e))?;
        private(&dir, &path.display())?;
        if sub != IMAGES {
            continue;
        }
        for name in list_dir(&dir).map_err(|e| ImageError::sys(path.display(), e))? {
            let image = path.join(&name);
            match open_dir_nofollow(dir.as_raw_fd(), &name) {
                Ok(d) => private(&d, &image.display())?,
                // Not a directory this store made: not an image, nothing to protect.
                Err(Errno::ENOTDIR | Errno::ELOOP | Errno::ENOENT) => {}
                Err(e) => return Err(ImageError::sys(format!("opening {}", image.display()), e)),
            }
        }
    }
    Ok(())
}

/// `e`, a failure to create the store at `root` or a directory above it, told as what it
/// means when this user may not create it: the store is someone else's to make (a node's is
/// its agent's, root's). Other failures are left as they are.
fn not_allowed(root: &Path, e: ImageError) -> ImageError {
    if e.kind != ErrorKind::PermissionDenied {
        return e;
    }
    ImageError::new(
        ErrorKind::PermissionDenied,
        format!(
            "there is no image store at {} and this user may not make one there ({}); a node's \
             store is its agent's and root's: run `wharf image` as root (with sudo) on the \
             node, or give --store a directory of your own",
            root.display(),
            e.message
        ),
    )
}

fn not_owner(root: &Path, owner: Option<u32>) -> ImageError {
    let whose = owner.map_or("another user's".to_string(), |uid| format!("uid {uid}'s"));
    ImageError::new(
        ErrorKind::PermissionDenied,
        format!(
            "the image store {} is {whose} and private to it; run `wharf image` as that user \
             (root for a node's store), or give --store a directory of your own",
            root.display()
        ),
    )
}

fn read_info(path: &Path) -> Result<ImageInfo> {
    let bytes = fs::read(path).map_err(|e| ImageError::io(path.display(), e))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ImageError::new(
            ErrorKind::Unavailable,
            format!("{} is corrupt: {e}", path.display()),
        )
    })
}

/// Bytes of regular-file content under `root`, hard links counted once. `root` is this
/// import's own directory, so walking it by path follows no link planted by the image.
pub(crate) fn tree_size(root: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = fs::read_dir(&dir).map_err(|e| ImageError::io(dir.display(), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io(dir.display(), e))?;
            let meta = entry
                .metadata()
                .map_err(|e| ImageError::io(entry.path().display(), e))?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && (meta.nlink() == 1 || seen.insert((meta.dev(), meta.ino())))
            {
                total += meta.len();
            }
        }
    }
    Ok(total)
}
