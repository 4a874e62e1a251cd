//! A submitting user's Unix groups, for partitions' AllowGroups.
//!
//! The controller knows a user by the uid the kernel gave it with the connection; their groups
//! come from the system's user and group databases (getgrouplist, as Slurm resolves
//! AllowGroups), so whatever NSS serves (files, LDAP, SSSD) is what counts. Tests inject their
//! own lookup ([`crate::cluster::Cluster::with_group_lookup`]).

use std::ffi::CString;

use nix::unistd::{getgrouplist, Gid, Group, Uid, User};
use wharf_api::Owner;

/// Finds the names of the groups `owner` is in, primary group included; the error says why
/// they could not be found.
pub type GroupLookup = fn(&Owner) -> Result<Vec<String>, String>;

/// The groups of `owner.uid` in the system's databases: its passwd entry's primary group and
/// every group that lists it. A group without a name is given by its number.
pub fn unix_groups(owner: &Owner) -> Result<Vec<String>, String> {
    let user = User::from_uid(Uid::from_raw(owner.uid))
        .map_err(|e| format!("looking up uid {}: {e}", owner.uid))?
        .ok_or_else(|| format!("uid {} has no user entry", owner.uid))?;
    let name = CString::new(user.name.as_bytes())
        .map_err(|_| format!("user name of uid {} contains a NUL byte", owner.uid))?;
    let gids = getgrouplist(&name, user.gid)
        .map_err(|e| format!("looking up the groups of {}: {e}", user.name))?;
    Ok(gids.into_iter().map(group_name).collect())
}

fn group_name(gid: Gid) -> String {
    Group::from_gid(gid)
        .ok()
        .flatten()
        .map(|g| g.name)
        .unwrap_or_else(|| gid.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_groups_include_its_primary_group() {
        let root = Owner {
            uid: 0,
            gid: 0,
            user: "root".into(),
        };
        let groups = unix_groups(&root).unwrap();
        let primary = group_name(Gid::from_raw(0));
        assert!(groups.contains(&primary), "{groups:?}");
        let nobody = Owner {
            uid: u32::MAX - 7,
            gid: 0,
            user: "x".into(),
        };
        assert!(unix_groups(&nobody)
            .unwrap_err()
            .contains("has no user entry"));
    }
}
