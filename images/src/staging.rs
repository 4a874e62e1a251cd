//! Directories under the store's `tmp/` that become images, or are on their way out.

use std::fs::{self, DirBuilder};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;

use crate::error::{ImageError, Result};

/// A directory under `tmp/`, deleted when dropped: a failed import's work, an image being
/// removed, or (after an exchange) the image that was replaced.
#[derive(Debug)]
pub(crate) struct Staging {
    /// The directory.
    pub path: PathBuf,
}

static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

impl Staging {
    /// Creates `tmp/<what>-<pid>-<seq>-<nanos>` with exactly `mode`; the pid lets `open` tell
    /// leftovers.
    pub fn create(tmp: &Path, what: &str, mode: u32) -> Result<Staging> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        loop {
            let seq = STAGING_SEQ.fetch_add(1, Ordering::Relaxed);
            let path = tmp.join(format!("{what}-{}-{seq}-{nanos}", std::process::id()));
            match DirBuilder::new().mode(mode).create(&path) {
                Ok(()) => {
                    let staging = Staging { path };
                    // The umask may have taken bits away; `mode` is what the store needs.
                    fs::set_permissions(&staging.path, fs::Permissions::from_mode(mode))
                        .map_err(|e| ImageError::io(staging.path.display(), e))?;
                    return Ok(staging);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(ImageError::io(format!("creating {}", path.display()), e)),
            }
        }
    }

    /// Moves this directory to `dest`, exchanging atomically with an image already there
    /// (which then lives here and is deleted on drop).
    pub fn publish(&self, dest: &Path) -> Result<()> {
        let fail =
            |e: Errno| ImageError::sys(format!("moving the new image to {}", dest.display()), e);
        match rename2(&self.path, dest, libc::RENAME_NOREPLACE) {
            Ok(()) => Ok(()),
            Err(Errno::EEXIST | Errno::ENOTEMPTY) => {
                rename2(&self.path, dest, libc::RENAME_EXCHANGE).map_err(fail)
            }
            Err(e) => Err(fail(e)),
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Missing after a plain rename: nothing to do. Any other failure leaves a leftover
        // that `open` clears later.
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// `renameat2(2)` with `flags`; called directly because libc wrappers differ across C
/// libraries and nix offers it on glibc only.
fn rename2(from: &Path, to: &Path, flags: libc::c_uint) -> nix::Result<()> {
    let cstr =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL);
    let (from, to) = (cstr(from)?, cstr(to)?);
    // SAFETY: both paths are valid NUL-terminated strings that outlive the call.
    let res = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            flags,
        )
    };
    Errno::result(res).map(drop)
}

pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(path)?;
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()
    };
    write().map_err(|e| ImageError::io(format!("writing {}", path.display()), e))
}

/// Deletes `tmp/` entries left by processes that no longer exist (a crash mid-import).
pub(crate) fn clear_stale(tmp: &Path) {
    let Ok(entries) = fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = std::str::from_utf8(name.as_bytes())
            .ok()
            .and_then(|n| n.split('-').nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        let gone = pid.is_some_and(|p| {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None) == Err(Errno::ESRCH)
        });
        if gone {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}
