//! The job's user namespace, made by the shim and joined by the container.
//!
//! libcontainer writes id maps itself only for a single mapping or through newuidmap; neither
//! fits "the user is themselves, root is nobody" (see FIELD-NOTES). So the shim forks a holder
//! that unshares a user namespace, writes both lines of each map from outside as real root, and
//! the container joins it by path. Once the container has joined, the holder is released.

use std::fs;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, pipe2, read, write, ForkResult, Pid};

use crate::error::{ErrorKind, RuntimeError};

/// The uid_map and gid_map contents for a job running as `uid:gid` with `groups`, container
/// root mapped to `root_host_id`. Every id maps to itself except root. A job of host root maps
/// root to root.
pub(crate) fn id_maps(
    uid: u32,
    gid: u32,
    groups: &[u32],
    root_host_id: u32,
) -> Result<(String, String), RuntimeError> {
    let mut gids: Vec<u32> = groups
        .iter()
        .copied()
        .chain([gid])
        .filter(|&g| g != 0)
        .collect();
    gids.sort_unstable();
    gids.dedup();
    if uid != 0 && uid == root_host_id || gids.contains(&root_host_id) {
        return Err(RuntimeError::new(
            ErrorKind::InvalidInput,
            format!("job ids collide with the sandbox root id {root_host_id}; configure another `root_host_id`"),
        ));
    }
    let uid_map = if uid == 0 {
        "0 0 1\n".to_string()
    } else {
        format!("0 {root_host_id} 1\n{uid} {uid} 1\n")
    };
    let root_gid = if gid == 0 || groups.contains(&0) {
        0
    } else {
        root_host_id
    };
    let mut gid_map = format!("0 {root_gid} 1\n");
    for g in gids {
        gid_map.push_str(&format!("{g} {g} 1\n"));
    }
    Ok((uid_map, gid_map))
}

/// The maps for a job that is root inside: uid and gid 0 are the user's own ids on the host;
/// supplementary groups map to themselves.
pub(crate) fn root_maps(uid: u32, gid: u32, groups: &[u32]) -> (String, String) {
    let mut gid_map = format!("0 {gid} 1\n");
    let mut extra: Vec<u32> = groups
        .iter()
        .copied()
        .filter(|&g| g != gid && g != 0)
        .collect();
    extra.sort_unstable();
    extra.dedup();
    for g in extra {
        gid_map.push_str(&format!("{g} {g} 1\n"));
    }
    (format!("0 {uid} 1\n"), gid_map)
}

/// A process holding a fresh, mapped user namespace open.
#[derive(Debug)]
pub(crate) struct UserNsHolder {
    pid: Pid,
    release: Option<OwnedFd>,
}

impl UserNsHolder {
    /// Forks the holder and writes its maps. Must be called from a single-threaded process.
    pub(crate) fn create(uid_map: &str, gid_map: &str) -> Result<Self, RuntimeError> {
        let (ready_r, ready_w) =
            pipe2(OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe", e))?;
        let (release_r, release_w) =
            pipe2(OFlag::O_CLOEXEC).map_err(|e| RuntimeError::sys("pipe", e))?;
        // SAFETY: the shim is single-threaded; the child only calls unshare, write, read, _exit.
        match unsafe { fork() }.map_err(|e| RuntimeError::sys("fork user namespace holder", e))? {
            ForkResult::Child => {
                drop(ready_r);
                drop(release_w);
                let ok = unshare(CloneFlags::CLONE_NEWUSER).is_ok();
                let _ = write(&ready_w, if ok { b"y" } else { b"n" });
                let mut buf = [0u8; 1];
                let _ = read(std::os::fd::AsRawFd::as_raw_fd(&release_r), &mut buf);
                // SAFETY: leaving the forked child without running destructors.
                unsafe { libc::_exit(0) }
            }
            ForkResult::Parent { child } => {
                drop(ready_w);
                drop(release_r);
                let mut holder = UserNsHolder {
                    pid: child,
                    release: Some(release_w),
                };
                let mut buf = [0u8; 1];
                let n = read(std::os::fd::AsRawFd::as_raw_fd(&ready_r), &mut buf)
                    .map_err(|e| RuntimeError::sys("waiting for user namespace holder", e))?;
                if n != 1 || buf[0] != b'y' {
                    holder.release();
                    return Err(RuntimeError::new(
                        ErrorKind::Unavailable,
                        "cannot create a user namespace on this node (is user.max_user_namespaces 0?)",
                    ));
                }
                let proc = PathBuf::from(format!("/proc/{child}"));
                if let Err(e) = fs::write(proc.join("uid_map"), uid_map) {
                    holder.release();
                    return Err(RuntimeError::io(format!("writing uid_map {uid_map:?}"), e));
                }
                if let Err(e) = fs::write(proc.join("gid_map"), gid_map) {
                    holder.release();
                    return Err(RuntimeError::io(format!("writing gid_map {gid_map:?}"), e));
                }
                Ok(holder)
            }
        }
    }

    /// Path the container joins.
    pub(crate) fn ns_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/user", self.pid))
    }

    /// Ends the holder and reaps it. Idempotent. (Killed, not asked: the container's processes
    /// hold copies of the release pipe until they exec.)
    pub(crate) fn release(&mut self) {
        if self.release.take().is_some() {
            let _ = kill(self.pid, Signal::SIGKILL);
            let _ = waitpid(self.pid, None);
        }
    }
}

impl Drop for UserNsHolder {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_user_to_itself_and_root_to_nobody() {
        let (u, g) = id_maps(1000, 1000, &[1000, 27], 65534).unwrap();
        assert_eq!(u, "0 65534 1\n1000 1000 1\n");
        assert_eq!(g, "0 65534 1\n27 27 1\n1000 1000 1\n");
        let (u, g) = id_maps(0, 0, &[], 65534).unwrap();
        assert_eq!((u.as_str(), g.as_str()), ("0 0 1\n", "0 0 1\n"));
        assert!(id_maps(65534, 65534, &[], 65534).is_err());
        let (u, g) = root_maps(1000, 1000, &[1000, 27]);
        assert_eq!(
            (u.as_str(), g.as_str()),
            ("0 1000 1\n", "0 1000 1\n27 27 1\n")
        );
    }
}
