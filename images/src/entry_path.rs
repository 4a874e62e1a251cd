//! Turning an archive entry's raw path into a path that cannot leave the root.
//!
//! This is the lexical half of the defence; the other half is that every path is then
//! resolved by the kernel inside the root (`openat2` with `RESOLVE_IN_ROOT`, see
//! [`crate::rootfs`]), so symlinks planted by earlier entries cannot lead out either.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Longest entry path or symlink target accepted, in bytes (Linux `PATH_MAX`).
pub(crate) const MAX_PATH_BYTES: usize = 4096;
/// Deepest entry path accepted. Also bounds the recursion (and open descriptors) of
/// [`crate::rootfs::RootDir::remove_tree`], since nothing deeper can be created.
pub(crate) const MAX_DEPTH: usize = 256;
/// Longest file name (Linux `NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;

/// Normalizes an entry path: leading `/` and `./` go, `.` and empty components go, `..`
/// removes the previous component and is refused where it would climb above the root.
/// The result holds only normal components; it is empty for the root itself.
///
/// Errors: a text saying why, for the caller to wrap with the entry name.
pub(crate) fn normalize(raw: &[u8]) -> Result<PathBuf, String> {
    if raw.contains(&0) {
        return Err("path contains a NUL byte".into());
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(format!("path is longer than {MAX_PATH_BYTES} bytes"));
    }
    let mut parts: Vec<&[u8]> = Vec::new();
    for comp in raw.split(|b| *b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                if parts.pop().is_none() {
                    return Err("path climbs above the root with '..'".into());
                }
            }
            name if name.len() > MAX_NAME_BYTES => {
                return Err(format!(
                    "a path component is longer than {MAX_NAME_BYTES} bytes"
                ));
            }
            name => parts.push(name),
        }
    }
    if parts.len() > MAX_DEPTH {
        return Err(format!("path is deeper than {MAX_DEPTH} components"));
    }
    Ok(parts.iter().map(|p| OsStr::from_bytes(p)).collect())
}

/// Checks a symlink target, which is stored as-is: it is resolved inside the container's
/// root when the container runs, never by the host while unpacking.
pub(crate) fn check_link_target(raw: &[u8]) -> Result<(), String> {
    if raw.is_empty() {
        return Err("symlink target is empty".into());
    }
    if raw.contains(&0) {
        return Err("symlink target contains a NUL byte".into());
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(format!(
            "symlink target is longer than {MAX_PATH_BYTES} bytes"
        ));
    }
    Ok(())
}

/// Shows raw entry bytes in messages without trusting them to be text.
pub(crate) fn show(raw: &[u8]) -> String {
    let shown = String::from_utf8_lossy(&raw[..raw.len().min(300)]);
    format!("{shown:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn ok(raw: &str) -> PathBuf {
        normalize(raw.as_bytes()).unwrap()
    }

    #[test]
    fn strips_roots_and_dots() {
        assert_eq!(ok("/etc/passwd"), Path::new("etc/passwd"));
        assert_eq!(ok("./usr//bin/./sh"), Path::new("usr/bin/sh"));
        assert_eq!(ok("a/b/../c/"), Path::new("a/c"));
        assert_eq!(ok("./"), Path::new(""));
        assert_eq!(ok("/"), Path::new(""));
        assert_eq!(ok("a/.."), Path::new(""));
    }

    #[test]
    fn refuses_climbing_and_junk() {
        for raw in ["../etc/x", "../../etc/x", "a/../../b", "/../x", "./.."] {
            assert!(normalize(raw.as_bytes()).is_err(), "{raw}");
        }
        assert!(normalize(b"a\0b").is_err());
        assert!(normalize(&vec![b'a'; MAX_PATH_BYTES + 1]).is_err());
        assert!(normalize(&vec![b'a'; 256]).is_err());
        assert!(normalize("a/".repeat(MAX_DEPTH + 1).as_bytes()).is_err());
        assert!(normalize("a/".repeat(MAX_DEPTH).as_bytes()).is_ok());
    }

    #[test]
    fn link_targets() {
        assert!(check_link_target(b"/tmp/outside").is_ok());
        assert!(check_link_target(b"../../x").is_ok());
        assert!(check_link_target(b"").is_err());
        assert!(check_link_target(b"a\0").is_err());
    }
}
