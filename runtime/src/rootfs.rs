//! The container's root: the image (or the host's `/`) bound read-only, recursively, inside the
//! shim's own mount namespace.
//!
//! The shim moves into a private mount namespace first, so every mount made here disappears
//! when the shim and its container are gone: nothing to clean up on the host, even after a
//! crash. Binding also lets the host's own `/` serve as a root (pivot_root refuses the root
//! itself) and makes every submount read-only, nosuid and nodev in one call (mount_setattr).

use std::path::{Path, PathBuf};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use crate::error::RuntimeError;

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Enters a private mount namespace and binds `source` at `target` (created), recursively
/// read-only, nosuid, nodev. Returns `target`.
pub(crate) fn bind_root(source: &Path, target: &Path) -> Result<PathBuf, RuntimeError> {
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| RuntimeError::sys("unshare mount namespace", e))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| RuntimeError::sys("making mounts private", e))?;
    std::fs::create_dir_all(target).map_err(|e| RuntimeError::io(target.display(), e))?;
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| RuntimeError::sys(format!("binding {} as the root", source.display()), e))?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let path = std::ffi::CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| RuntimeError::new(crate::ErrorKind::InvalidInput, "root path contains NUL"))?;
    // SAFETY: valid C string and a properly sized mount_attr.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        return Err(RuntimeError::io(
            "making the root read-only",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(target.to_path_buf())
}
