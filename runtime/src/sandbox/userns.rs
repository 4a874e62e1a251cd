//! The id maps of a job's user namespace: the user is themselves, root is nobody (or, for a
//! job that is root inside, the user). The shim writes them, from outside and as real root,
//! for the container's init it has just cloned into a new user namespace (see `sandbox`);
//! only real root may write several lines.

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
