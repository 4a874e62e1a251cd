//! A root filesystem under construction, written only through descriptors resolved inside it.
//!
//! Why not `tar::Entry::unpack_in`: it checks paths lexically and then writes through host
//! paths, so a symlink planted by an earlier entry (or layer) can redirect a later write
//! outside the root. Here every parent directory is
//! opened with `openat2(RESOLVE_IN_ROOT)`, so the kernel resolves `..` and symlinks as if the
//! root were `/`; the final component is created relative to that descriptor with
//! `O_NOFOLLOW`/`O_EXCL`, after unlinking whatever non-directory was there (see [`create`]).

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fchmod, fstatat, mkdirat, Mode};
use nix::unistd::{fchown, Gid, Uid};

use crate::error::{ErrorKind, ImageError, Result};
use crate::fsutil::{is_dir, open_dir_nofollow, owned, prune_in, remove_tree};

mod create;

/// Ownership, permission bits and modification time of an entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta {
    /// Permission bits, setuid/setgid/sticky included (`& 0o7777` is applied).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Seconds since the epoch; applied to files and symlinks only.
    pub mtime: Option<i64>,
}

/// Top-level directories the sandbox mounts its own filesystems on, hiding what the image has
/// there: the one list the unpacker (which makes them) and the sandbox (which refuses a root
/// where one is a symlink or not a directory) share.
pub const SANDBOX_MOUNT_POINTS: [&str; 4] = ["proc", "dev", "sys", "tmp"];

/// Mode of a mount point the image lacks.
fn mount_point_mode(name: &str) -> u32 {
    if name == "tmp" {
        0o1777
    } else {
        0o755
    }
}

/// What every unpacked root gets when the image lacks it: the mount points, and `etc`, where
/// the sandbox writes the job's identity files.
const MADE_DIRS: [&str; 5] = [
    SANDBOX_MOUNT_POINTS[0],
    SANDBOX_MOUNT_POINTS[1],
    SANDBOX_MOUNT_POINTS[2],
    SANDBOX_MOUNT_POINTS[3],
    "etc",
];

/// An open root directory that entries are written into.
#[derive(Debug)]
pub(crate) struct RootDir {
    fd: OwnedFd,
    /// Whether to apply entry ownership (only root may; rootless imports keep their own).
    chown: bool,
}

/// The error for entry `entry` failing at `doing`: a contradictory tree is bad input, the rest
/// is the node's problem.
fn fail(entry: &Path, doing: &str, e: Errno) -> ImageError {
    let what = format!("entry '{}': {doing}", entry.display());
    match e {
        Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV | Errno::EEXIST | Errno::EISDIR => {
            ImageError::invalid(format!("{what}: {e}"))
        }
        Errno::ENOSYS => ImageError::new(
            ErrorKind::Unavailable,
            format!("{what}: this kernel lacks openat2 (Linux 5.6 or later is needed)"),
        ),
        _ => ImageError::sys(what, e),
    }
}

/// The last component of a normalized, non-empty entry path.
fn file_name(entry: &Path) -> &OsStr {
    entry.file_name().unwrap_or(entry.as_os_str())
}

impl RootDir {
    /// Opens `path`, an empty directory this import owns, as the root.
    pub fn open(path: &Path) -> Result<RootDir> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = nix::fcntl::open(path, flags, Mode::empty())
            .map_err(|e| ImageError::sys(format!("opening {}", path.display()), e))?;
        Ok(RootDir {
            fd: owned(fd),
            chown: nix::unistd::geteuid().is_root(),
        })
    }

    /// Resolves directory `rel` inside the root. `O_PATH` is enough for a parent used with
    /// `*at` calls; `readable` opens it for listing.
    fn resolve_dir(&self, rel: &Path, readable: bool) -> nix::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let mode = if readable {
            OFlag::O_RDONLY
        } else {
            OFlag::O_PATH
        };
        let how = OpenHow::new()
            .flags(mode | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        // EAGAIN: a concurrent rename raced the `..` check; nothing else renames in here.
        let mut tries = 0;
        loop {
            match openat2(self.fd.as_raw_fd(), rel, how) {
                Err(Errno::EAGAIN) if tries < 8 => tries += 1,
                other => return other.map(owned),
            }
        }
    }

    /// The directory that will hold `entry`, creating missing directories (0755, owned by
    /// the importer) one component at a time when `create`; `None` when it is missing and
    /// `create` is false.
    pub fn parent(&self, entry: &Path, create: bool) -> Result<Option<OwnedFd>> {
        let dir = entry.parent().unwrap_or(Path::new(""));
        match self.resolve_dir(dir, false) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::ENOENT) if create => {}
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(fail(entry, "resolving its directory", e)),
        }
        let mut cur = self
            .resolve_dir(Path::new(""), false)
            .map_err(|e| fail(entry, "", e))?;
        let mut prefix = PathBuf::new();
        for comp in dir.components() {
            prefix.push(comp);
            cur = match self.resolve_dir(&prefix, false) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    self.make_implicit_dir(&cur, comp.as_os_str(), entry, &prefix)?
                }
                Err(e) => return Err(fail(entry, &format!("resolving '{}'", prefix.display()), e)),
            };
        }
        Ok(Some(cur))
    }

    /// [`RootDir::parent`], creating what is missing.
    fn make_parent(&self, entry: &Path) -> Result<OwnedFd> {
        self.parent(entry, true)?
            .ok_or_else(|| fail(entry, "resolving its directory", Errno::ENOENT))
    }

    fn make_implicit_dir(
        &self,
        parent: &OwnedFd,
        name: &OsStr,
        entry: &Path,
        prefix: &Path,
    ) -> Result<OwnedFd> {
        match mkdirat(
            Some(parent.as_raw_fd()),
            name,
            Mode::from_bits_truncate(0o700),
        ) {
            Ok(()) => {}
            // It exists yet did not resolve: a symlink to something missing. Creating the
            // target would mean writing where the link points, which is exactly the attack.
            Err(Errno::EEXIST) => {
                return Err(ImageError::invalid(format!(
                    "entry '{}': '{}' is a symlink to a directory that does not exist",
                    entry.display(),
                    prefix.display()
                )))
            }
            Err(e) => return Err(fail(entry, &format!("creating '{}'", prefix.display()), e)),
        }
        let fd = open_dir_nofollow(parent.as_raw_fd(), name)
            .map_err(|e| fail(entry, &format!("opening '{}'", prefix.display()), e))?;
        fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(0o755))
            .map_err(|e| fail(entry, "setting the mode of a new directory", e))?;
        Ok(fd)
    }

    /// Empties the slot `name` in `parent`: unlinks a non-directory, removes a directory tree
    /// unless `keep_dir`. Returns whether a directory was kept.
    fn clear(&self, parent: RawFd, name: &OsStr, keep_dir: bool, entry: &Path) -> Result<bool> {
        match fstatat(Some(parent), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(fail(entry, "inspecting what it replaces", e)),
            Ok(st) if is_dir(&st) && keep_dir => Ok(true),
            Ok(_) => {
                remove_tree(parent, name)
                    .map_err(|e| fail(entry, "removing what it replaces", e))?;
                Ok(false)
            }
        }
    }

    /// Applies ownership (as root) then mode: chown clears setuid bits, so the mode goes last.
    fn apply(&self, fd: RawFd, meta: &Meta, entry: &Path) -> Result<()> {
        if self.chown {
            fchown(
                fd,
                Some(Uid::from_raw(meta.uid)),
                Some(Gid::from_raw(meta.gid)),
            )
            .map_err(|e| fail(entry, "setting its owner", e))?;
        }
        fchmod(fd, Mode::from_bits_truncate(meta.mode & 0o7777))
            .map_err(|e| fail(entry, "setting its mode", e))
    }

    /// Removes `entry` (a whole tree if a directory); nothing if it or its parent is missing.
    pub fn remove(&self, entry: &Path) -> Result<()> {
        if let Some(parent) = self.parent(entry, false)? {
            remove_tree(parent.as_raw_fd(), file_name(entry))
                .map_err(|e| fail(entry, "removing it", e))?;
        }
        Ok(())
    }

    /// Removes everything under directory `dir` whose path is not in `keep` (directories in
    /// `keep` are descended into); nothing if `dir` is missing. `keep` holds entry paths.
    pub fn prune(&self, dir: &Path, keep: &HashSet<PathBuf>) -> Result<()> {
        match self.resolve_dir(dir, true) {
            Ok(fd) => prune_in(&fd, dir, keep).map_err(|e| fail(dir, "clearing it", e)),
            Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(()),
            Err(e) => Err(fail(dir, "opening it", e)),
        }
    }

    /// Flushes the filesystem holding the root to disk.
    pub fn sync(&self) -> Result<()> {
        nix::unistd::syncfs(self.fd.as_raw_fd())
            .map_err(|e| ImageError::sys("syncing the new image to disk", e))
    }

    /// Creates the sandbox's mount points at the top when missing; leaves anything there.
    pub fn ensure_mount_points(&self) -> Result<()> {
        let root = self.fd.as_raw_fd();
        for name in MADE_DIRS {
            let mode = mount_point_mode(name);
            let entry = Path::new(name);
            match fstatat(Some(root), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(_) => continue,
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(fail(entry, "inspecting it", e)),
            }
            mkdirat(Some(root), name, Mode::from_bits_truncate(0o700))
                .map_err(|e| fail(entry, "creating it", e))?;
            let fd = open_dir_nofollow(root, OsStr::new(name))
                .map_err(|e| fail(entry, "opening it", e))?;
            fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(mode))
                .map_err(|e| fail(entry, "setting its mode", e))?;
        }
        Ok(())
    }
}
