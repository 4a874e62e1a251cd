//! Creating each kind of entry in its parent directory, never through what was there.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, futimens, mkdirat, Mode};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchownat, linkat, symlinkat, Gid, Uid};

use super::{fail, file_name, Meta, RootDir};
use crate::error::{ImageError, Result};
use crate::fsutil::{is_dir, open_dir_nofollow, owned};
use crate::limits::Budget;

impl RootDir {
    /// Writes a regular file from `content`, counting its bytes against `budget`.
    pub fn write_file(
        &self,
        entry: &Path,
        meta: &Meta,
        content: &mut dyn Read,
        budget: &mut Budget,
        buf: &mut [u8],
    ) -> Result<()> {
        let parent = self.make_parent(entry)?;
        let (p, name) = (parent.as_raw_fd(), file_name(entry));
        self.clear(p, name, false, entry)?;
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(Some(p), name, flags, Mode::from_bits_truncate(0o600))
            .map_err(|e| fail(entry, "creating it", e))?;
        let mut file = File::from(owned(fd));
        loop {
            let n = match content.read(buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == IoKind::Interrupted => continue,
                Err(e) => {
                    return Err(ImageError::stream(
                        format!("reading entry '{}'", entry.display()),
                        e,
                    ))
                }
            };
            budget.add_bytes(n as u64)?;
            file.write_all(&buf[..n])
                .map_err(|e| ImageError::io(format!("writing entry '{}'", entry.display()), e))?;
        }
        self.apply(file.as_raw_fd(), meta, entry)?;
        if let Some(t) = meta.mtime {
            let ts = TimeSpec::new(t, 0);
            futimens(file.as_raw_fd(), &ts, &ts)
                .map_err(|e| fail(entry, "setting its mtime", e))?;
        }
        Ok(())
    }

    /// Creates a directory, or keeps the one there and updates its owner and mode.
    pub fn make_dir(&self, entry: &Path, meta: &Meta) -> Result<()> {
        if entry.as_os_str().is_empty() {
            let fd = self
                .resolve_dir(Path::new(""), true)
                .map_err(|e| fail(entry, "", e))?;
            return self.apply(fd.as_raw_fd(), meta, Path::new("/"));
        }
        let parent = self.make_parent(entry)?;
        let (p, name) = (parent.as_raw_fd(), file_name(entry));
        if !self.clear(p, name, true, entry)? {
            mkdirat(Some(p), name, Mode::from_bits_truncate(0o700))
                .map_err(|e| fail(entry, "creating it", e))?;
        }
        let fd = open_dir_nofollow(p, name).map_err(|e| fail(entry, "opening it", e))?;
        self.apply(fd.as_raw_fd(), meta, entry)
    }

    /// Creates a symlink to `target`, stored as-is.
    pub fn make_symlink(&self, entry: &Path, target: &OsStr, meta: &Meta) -> Result<()> {
        let parent = self.make_parent(entry)?;
        let (p, name) = (parent.as_raw_fd(), file_name(entry));
        self.clear(p, name, false, entry)?;
        symlinkat(target, Some(p), name).map_err(|e| fail(entry, "creating the symlink", e))?;
        if self.chown {
            let (uid, gid) = (Uid::from_raw(meta.uid), Gid::from_raw(meta.gid));
            fchownat(
                Some(p),
                name,
                Some(uid),
                Some(gid),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| fail(entry, "setting its owner", e))?;
        }
        Ok(())
    }

    /// Creates a hard link to `target`, an entry path already in the root. The target is
    /// resolved inside the root with no symlink at all on the way, so it cannot be a host file.
    pub fn make_hardlink(&self, entry: &Path, target: &Path) -> Result<()> {
        let refuse = |why: &str| {
            ImageError::invalid(format!(
                "entry '{}': hard link target '{}' {why}",
                entry.display(),
                target.display()
            ))
        };
        if target.as_os_str().is_empty() {
            return Err(refuse("is the root directory"));
        }
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let tfd = match openat2(self.fd.as_raw_fd(), target, how) {
            Ok(fd) => owned(fd),
            Err(Errno::ENOENT) => return Err(refuse("does not exist in the image")),
            Err(Errno::ELOOP) => return Err(refuse("goes through a symlink; refused")),
            Err(e) => return Err(fail(entry, "opening its hard link target", e)),
        };
        let st = fstat(tfd.as_raw_fd()).map_err(|e| fail(entry, "inspecting its target", e))?;
        if is_dir(&st) {
            return Err(refuse("is a directory"));
        }
        let parent = self.make_parent(entry)?;
        let (p, name) = (parent.as_raw_fd(), file_name(entry));
        if let Ok(cur) = fstatat(Some(p), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            if cur.st_dev == st.st_dev && cur.st_ino == st.st_ino {
                return Ok(());
            }
        }
        self.clear(p, name, false, entry)?;
        let empty = OsStr::new("");
        match linkat(
            Some(tfd.as_raw_fd()),
            empty,
            Some(p),
            name,
            AtFlags::AT_EMPTY_PATH,
        ) {
            Ok(()) => Ok(()),
            // AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; without it, link through /proc.
            Err(Errno::ENOENT | Errno::EPERM) => {
                let via = OsString::from(format!("/proc/self/fd/{}", tfd.as_raw_fd()));
                linkat(
                    None,
                    via.as_os_str(),
                    Some(p),
                    name,
                    AtFlags::AT_SYMLINK_FOLLOW,
                )
                .map_err(|e| fail(entry, "creating the hard link", e))
            }
            Err(e) => Err(fail(entry, "creating the hard link", e)),
        }
    }
}
