//! Descriptor-relative helpers that never follow a symlink: listing, removing, pruning.

use std::collections::HashSet;
use std::ffi::{CStr, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Takes ownership of a descriptor fresh from a successful syscall.
pub(crate) fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open-like call and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Whether `st` describes a directory.
pub(crate) fn is_dir(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// Opens `name` in `parent` as a readable directory, refusing a symlink.
pub(crate) fn open_dir_nofollow(parent: RawFd, name: &OsStr) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(Some(parent), name, flags, Mode::empty()).map(owned)
}

/// Removes everything in `dir` (whose entry path is `rel`) that is not in `keep`, descending
/// into the directories that are.
pub(crate) fn prune_in(dir: &OwnedFd, rel: &Path, keep: &HashSet<PathBuf>) -> nix::Result<()> {
    for child in list_dir(dir)? {
        let path = rel.join(&child);
        if !keep.contains(&path) {
            remove_tree(dir.as_raw_fd(), &child)?;
            continue;
        }
        let st = fstatat(
            Some(dir.as_raw_fd()),
            child.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )?;
        if is_dir(&st) {
            let sub = open_dir_nofollow(dir.as_raw_fd(), &child)?;
            prune_in(&sub, &path, keep)?;
        }
    }
    Ok(())
}

/// Removes `name` in `parent`, recursing into directories without following any symlink.
/// Depth is bounded by [`crate::entry_path::MAX_DEPTH`]: nothing deeper is ever created.
pub(crate) fn remove_tree(parent: RawFd, name: &OsStr) -> nix::Result<()> {
    let st = match fstatat(Some(parent), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => return Ok(()),
        other => other?,
    };
    if !is_dir(&st) {
        return unlinkat(Some(parent), name, UnlinkatFlags::NoRemoveDir);
    }
    let dir = open_dir_nofollow(parent, name)?;
    for child in list_dir(&dir)? {
        remove_tree(dir.as_raw_fd(), &child)?;
    }
    drop(dir);
    unlinkat(Some(parent), name, UnlinkatFlags::RemoveDir)
}

/// The names in directory `dir`, without `.` and `..`.
pub(crate) fn list_dir(dir: &OwnedFd) -> nix::Result<Vec<OsString>> {
    list_dir_typed(dir).map(|entries| entries.into_iter().map(|(name, _)| name).collect())
}

/// The names in directory `dir`, without `.` and `..`, each with its `d_type` (`DT_UNKNOWN`
/// where the filesystem does not tell).
pub(crate) fn list_dir_typed(dir: &OwnedFd) -> nix::Result<Vec<(OsString, u8)>> {
    // A fresh open of "." rather than dup: the stream gets its own offset and owns the fd.
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let fd = openat(Some(dir.as_raw_fd()), ".", flags, Mode::empty())?;
    // SAFETY: `fd` is an open directory descriptor; on success the stream owns it.
    let stream = unsafe { libc::fdopendir(fd) };
    if stream.is_null() {
        let e = Errno::last();
        drop(owned(fd));
        return Err(e);
    }
    let mut names = Vec::new();
    let result = loop {
        Errno::clear();
        // SAFETY: `stream` is a valid DIR stream until the closedir below.
        let ent = unsafe { libc::readdir(stream) };
        if ent.is_null() {
            break if Errno::last_raw() == 0 {
                Ok(())
            } else {
                Err(Errno::last())
            };
        }
        // SAFETY: readdir returned a valid dirent whose d_name is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            // SAFETY: as above.
            let kind = unsafe { (*ent).d_type };
            names.push((OsStr::from_bytes(name).to_os_string(), kind));
        }
    };
    // SAFETY: closes the stream, and with it `fd`, exactly once.
    unsafe { libc::closedir(stream) };
    result.map(|()| names)
}

/// `FS_TOPDIR_FL` (`chattr +T`), from `linux/fs.h`.
const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;

/// Marks directory `dir` as the top of directory hierarchies (`chattr +T`), where the
/// filesystem supports it (ext2/3/4): each directory made in it then starts a new tree, placed
/// by the filesystem in a block group of its own instead of next to its parent.
///
/// Why: every layer and root is unpacked into a new directory of the store's `tmp/`. Kept next
/// to each other, new trees land in the block group where the last ones were deleted (an
/// eviction, a replaced image), and on ext4 without a journal the inode allocator skips each
/// inode freed in the last minutes one by one, for every inode it hands out: after a removed
/// image of a few thousand files, each new file costs a scan of them all, and a pull takes
/// several times as long. A hint only: nothing depends on it, and a filesystem without the
/// flag (XFS, btrfs, tmpfs) refuses it, which is ignored.
pub(crate) fn spread_subdirs(dir: &OwnedFd) {
    // An int, whatever the request's encoding says: that is what the kernel reads and writes.
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS and FS_IOC_SETFLAGS write and read one int through the pointer,
    // which outlives both calls; `dir` is an open descriptor.
    unsafe {
        if libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) == 0
            && flags & FS_TOPDIR_FL == 0
        {
            flags |= FS_TOPDIR_FL;
            libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags);
        }
    }
}
