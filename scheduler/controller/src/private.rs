//! Modes of the files that hold users' private data. They are set explicitly, never left to
//! the umask, and an existing install's modes are corrected at every start.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Makes `path` a directory with exactly `mode` (e.g. 0700), creating it (and, with mode
/// 0755, any missing parent) if needed, and correcting the mode of an existing one. A
/// symlink in its place is refused: the mode must be that of the directory itself.
pub fn dir(path: &Path, mode: u32) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        public_dir(parent)?;
    }
    match DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a directory", path.display()),
        ));
    }
    std::fs::set_permissions(path, Permissions::from_mode(mode))
}

/// Creates `path` and its missing parents with mode 0755 (whatever the umask); existing
/// directories keep the mode their admin gave them.
pub fn public_dir(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        public_dir(parent)?;
    }
    match DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => std::fs::set_permissions(path, Permissions::from_mode(0o755)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates `path` as an empty file of mode 0600 if it does not exist, and sets 0600 on it
/// and on any of `siblings` (suffixes such as `-wal`) that exist. SQLite gives its `-wal`,
/// `-shm` and `-journal` files the mode of the database file, so a 0600 database keeps them
/// private too; fixing them here covers files made by an older version.
pub fn file(path: &Path, siblings: &[&str]) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?
        .set_permissions(Permissions::from_mode(0o600))?;
    for suffix in siblings {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        match std::fs::set_permissions(Path::new(&name), Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn modes_are_exact_whatever_the_umask_and_fixed_when_wrong() {
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("a/b/state");
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        let made = dir(&state, 0o700);
        nix::sys::stat::umask(old);
        made.unwrap();
        assert_eq!(mode(&state), 0o700);
        // Parents made on the way stay reachable even under umask 077.
        assert_eq!(mode(&tmp.path().join("a/b")), 0o755);
        std::fs::set_permissions(&state, Permissions::from_mode(0o755)).unwrap();
        dir(&state, 0o700).unwrap();
        assert_eq!(mode(&state), 0o700);

        let db = state.join("wharf.db");
        std::fs::write(&db, b"").unwrap();
        std::fs::write(state.join("wharf.db-wal"), b"").unwrap();
        std::fs::set_permissions(&db, Permissions::from_mode(0o644)).unwrap();
        std::fs::set_permissions(state.join("wharf.db-wal"), Permissions::from_mode(0o644))
            .unwrap();
        file(&db, &["-wal", "-shm"]).unwrap();
        assert_eq!(mode(&db), 0o600);
        assert_eq!(mode(&state.join("wharf.db-wal")), 0o600);
        assert!(!state.join("wharf.db-shm").exists());
    }

    #[test]
    fn a_symlink_is_not_a_private_directory() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/tmp", tmp.path().join("link")).unwrap();
        assert!(dir(&tmp.path().join("link"), 0o700).is_err());
    }
}
