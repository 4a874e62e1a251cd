//! One agent per cgroup parent. A job's cgroup is named by its job id under the agent's
//! `cgroup_parent` (`/wharf/wharf-12`), and ids are the cluster's. Two agents on one machine
//! under one parent (a second agent started by hand, `wharf dev` beside a node's service)
//! would therefore share the cgroup of a job that has a rank on each, and the rank that ends
//! first would kill the other's processes as it cleans up its own. An agent holds an
//! exclusive `flock` on its parent's directory for its whole life, and a second one is
//! refused at start, saying which parent and what to change.

use std::fs::File;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use crate::cgroup_usage::{is_v2, CGROUP_ROOT};

/// The lock on a cgroup parent, held until dropped (or the process ends). The descriptor is
/// close-on-exec: no process the agent starts inherits it.
#[derive(Debug)]
pub struct ParentClaim {
    _lock: Option<Flock<File>>,
}

/// Takes `parent` (a cgroup path such as `wharf` or `/site/wharf`) for this process: makes
/// its directory if it is not there and locks it, on the unified hierarchy (cgroup v2) or on
/// the first v1 hierarchy the machine has of those every job's cgroup is made in (the
/// sandbox's `V1_CONTROLLERS`), which stands for all. Another process
/// holding it is an error naming it; a parent that cannot be made or opened (an unusable
/// path) is claimed as nothing, and each job's launch says what is wrong with it.
///
/// The lock is on the directory: it holds only while the directory does. Wharf never
/// removes a cgroup parent; an admin who does while the agent runs lets a second one in.
pub fn claim_cgroup_parent(parent: &str) -> Result<ParentClaim, String> {
    let root = Path::new(CGROUP_ROOT);
    let hierarchy = if is_v2() {
        Some(root.to_path_buf())
    } else {
        let v1 = crate::sandbox::cgroup_setup::V1_CONTROLLERS.map(|h| root.join(h));
        v1.into_iter().find(|h| h.is_dir())
    };
    match hierarchy {
        Some(h) => claim_dir(&h.join(parent.trim_matches('/')), parent),
        None => Ok(ParentClaim { _lock: None }),
    }
}

fn claim_dir(dir: &Path, parent: &str) -> Result<ParentClaim, String> {
    let _ = std::fs::create_dir_all(dir);
    let Ok(file) = File::open(dir) else {
        return Ok(ParentClaim { _lock: None });
    };
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(ParentClaim { _lock: Some(lock) }),
        Err((_, Errno::EWOULDBLOCK)) => Err(format!(
            "another wharf agent on this machine runs its jobs under cgroup parent {parent:?} \
             ({}); two agents there would kill each other's jobs. Stop the other agent, or \
             give this one an `[agent] cgroup_parent` of its own",
            dir.display()
        )),
        Err(_) => Ok(ParentClaim { _lock: None }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_of_one_directory_is_refused_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("parent");
        let first = claim_dir(&dir, "parent").unwrap();
        assert!(first._lock.is_some(), "the directory is made and locked");
        let second = claim_dir(&dir, "parent").unwrap_err();
        assert!(second.contains("cgroup parent \"parent\""), "{second}");
        assert!(second.contains("`[agent] cgroup_parent`"), "{second}");
        drop(first);
        assert!(claim_dir(&dir, "parent").unwrap()._lock.is_some());
    }

    #[test]
    fn a_parent_that_cannot_be_made_is_claimed_as_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let claim = claim_dir(&file.join("below"), "x").unwrap();
        assert!(claim._lock.is_none());
    }
}
