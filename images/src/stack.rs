//! Stacking unpacked layers into one root by hard links: each layer's directories are made
//! (or kept) in the root with the layer's owner, mode and mtime, its files are linked (no
//! content copied), its symlinks recreated, and its whiteouts applied to what the layers
//! below left: `.wh.NAME` removes `NAME`, `.wh..wh..opq` empties the directory. In each
//! directory the whiteouts are applied first, so they never touch what the same layer holds.
//!
//! Everything is done through descriptors, with no symlink followed: the layers were written
//! by the safe extractor, and the root is made here from them alone. A file shared by many
//! images is one inode; jobs see it read-only through their overlay, so nothing can change
//! it through one image.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstatat, futimens, mkdirat, FileStat, Mode};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

use crate::error::{ImageError, Result};
use crate::fsutil::{is_dir, list_dir, list_dir_typed, open_dir_nofollow, owned, remove_tree};

const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
const AUFS_META: &[u8] = b".wh..wh.";

/// Stacks `layers` (directories, bottom first) into the empty directory `root`.
///
/// Errors: the filesystem's, naming the layer and the entry.
pub(crate) fn stack(root: &Path, layers: &[PathBuf]) -> Result<()> {
    let open = |p: &Path| {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        nix::fcntl::open(p, flags, Mode::empty())
            .map(owned)
            .map_err(|e| ImageError::sys(format!("opening {}", p.display()), e))
    };
    let root_fd = open(root)?;
    let chown = nix::unistd::geteuid().is_root();
    for (i, layer) in layers.iter().enumerate() {
        let layer_fd = open(layer)?;
        apply_dir(&layer_fd, &root_fd, Path::new(""), chown).map_err(|(path, e)| {
            ImageError::sys(
                format!("stacking layer {} at '{}'", i + 1, path.display()),
                e,
            )
        })?;
    }
    Ok(())
}

/// Directory entries with their `d_type`.
type Named = Vec<(OsString, u8)>;

type Step<T = ()> = std::result::Result<T, (PathBuf, Errno)>;

fn at<T>(rel: &Path, name: &OsStr, r: nix::Result<T>) -> Step<T> {
    r.map_err(|e| (rel.join(name), e))
}

/// Applies the layer directory `layer` (at `rel`) onto the root's directory `root`.
fn apply_dir(layer: &OwnedFd, root: &OwnedFd, rel: &Path, chown: bool) -> Step {
    let mut names = list_dir_typed(layer).map_err(|e| (rel.to_path_buf(), e))?;
    names.sort();
    let (whiteouts, entries): (Named, Named) = names
        .into_iter()
        .partition(|(n, _)| n.as_bytes().starts_with(WHITEOUT));
    for (wh, _) in &whiteouts {
        let name = wh.as_bytes();
        if name == OPAQUE {
            for child in list_dir(root).map_err(|e| (rel.to_path_buf(), e))? {
                at(rel, &child, remove_tree(root.as_raw_fd(), &child))?;
            }
        } else if !name.starts_with(AUFS_META) {
            let hidden = &name[WHITEOUT.len()..];
            // The extractor refuses these in layers; never let one name `.` or `..` here.
            if !hidden.is_empty() && hidden != b"." && hidden != b".." {
                let hidden = OsStr::from_bytes(hidden);
                at(rel, hidden, remove_tree(root.as_raw_fd(), hidden))?;
            }
        }
    }
    for (name, kind) in &entries {
        if *kind == libc::DT_REG {
            // Most entries: linked without a stat, and without clearing a slot that is
            // nearly always empty (cleared only when the link finds it taken).
            at(rel, name, link_file(layer, root, name))?;
            continue;
        }
        let st = at(
            rel,
            name,
            fstatat(
                Some(layer.as_raw_fd()),
                name.as_os_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ),
        )?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                let sub_root = at(rel, name, ensure_dir(root, name))?;
                let sub_layer = at(rel, name, open_dir_nofollow(layer.as_raw_fd(), name))?;
                apply_dir(&sub_layer, &sub_root, &rel.join(name), chown)?;
                // After the children: creating them changes the directory's mtime.
                at(rel, name, set_meta(&sub_root, &st, chown))?;
            }
            libc::S_IFREG => at(rel, name, link_file(layer, root, name))?,
            libc::S_IFLNK => {
                at(rel, name, remove_tree(root.as_raw_fd(), name))?;
                let target = at(
                    rel,
                    name,
                    readlinkat(Some(layer.as_raw_fd()), name.as_os_str()),
                )?;
                at(
                    rel,
                    name,
                    symlinkat(target.as_os_str(), Some(root.as_raw_fd()), name.as_os_str()),
                )?;
                if chown {
                    at(
                        rel,
                        name,
                        fchownat(
                            Some(root.as_raw_fd()),
                            name.as_os_str(),
                            Some(Uid::from_raw(st.st_uid)),
                            Some(Gid::from_raw(st.st_gid)),
                            AtFlags::AT_SYMLINK_NOFOLLOW,
                        ),
                    )?;
                }
            }
            // The extractor writes nothing else into a layer.
            _ => {}
        }
    }
    Ok(())
}

/// Links the layer's regular file `name` into the root's directory `root`, replacing whatever
/// the root has there.
fn link_file(layer: &OwnedFd, root: &OwnedFd, name: &OsStr) -> nix::Result<()> {
    let link = || {
        linkat(
            Some(layer.as_raw_fd()),
            name,
            Some(root.as_raw_fd()),
            name,
            AtFlags::empty(),
        )
    };
    match link() {
        Err(Errno::EEXIST) => {
            remove_tree(root.as_raw_fd(), name)?;
            link()
        }
        other => other,
    }
}

/// The root's directory `name` in `root`: kept when it is one, else made (whatever
/// non-directory was there goes).
fn ensure_dir(root: &OwnedFd, name: &OsStr) -> nix::Result<OwnedFd> {
    match fstatat(Some(root.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if is_dir(&st) => {}
        Ok(_) => {
            unlinkat(Some(root.as_raw_fd()), name, UnlinkatFlags::NoRemoveDir)?;
            mkdirat(
                Some(root.as_raw_fd()),
                name,
                Mode::from_bits_truncate(0o700),
            )?;
        }
        Err(Errno::ENOENT) => mkdirat(
            Some(root.as_raw_fd()),
            name,
            Mode::from_bits_truncate(0o700),
        )?,
        Err(e) => return Err(e),
    }
    open_dir_nofollow(root.as_raw_fd(), name)
}

/// Gives directory `dir` the owner (when root), mode and mtime of `st`.
fn set_meta(dir: &OwnedFd, st: &FileStat, chown: bool) -> nix::Result<()> {
    if chown {
        fchown(
            dir.as_raw_fd(),
            Some(Uid::from_raw(st.st_uid)),
            Some(Gid::from_raw(st.st_gid)),
        )?;
    }
    fchmod(
        dir.as_raw_fd(),
        Mode::from_bits_truncate(st.st_mode & 0o7777),
    )?;
    let ts = TimeSpec::new(st.st_mtime, st.st_mtime_nsec);
    futimens(dir.as_raw_fd(), &ts, &ts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

    #[test]
    fn stacks_by_links_with_whiteouts_replacing_kinds() {
        let tmp = tempfile::tempdir().unwrap();
        let (lower, upper, root) = (
            tmp.path().join("lower"),
            tmp.path().join("upper"),
            tmp.path().join("root"),
        );
        for d in ["a/sub", "b", "c", "opq/old", "keep"] {
            fs::create_dir_all(lower.join(d)).unwrap();
        }
        fs::write(lower.join("a/sub/f"), "lower").unwrap();
        fs::write(lower.join("b/file"), "b").unwrap();
        fs::write(lower.join("c/x"), "c").unwrap();
        fs::write(lower.join("opq/gone"), "g").unwrap();
        fs::write(lower.join("keep/k"), "k").unwrap();
        fs::write(lower.join("was-file"), "f").unwrap();
        fs::create_dir_all(upper.join("opq")).unwrap();
        fs::create_dir_all(upper.join("was-file")).unwrap();
        fs::create_dir_all(upper.join("a")).unwrap();
        fs::write(upper.join(".wh.b"), "").unwrap();
        fs::write(upper.join("opq/.wh..wh..opq"), "").unwrap();
        fs::write(upper.join("opq/new"), "n").unwrap();
        fs::write(upper.join("was-file/inside"), "i").unwrap();
        fs::write(upper.join(".wh.."), "").unwrap();
        symlink("/etc/passwd", upper.join("c")).unwrap();
        fs::set_permissions(upper.join("a"), fs::Permissions::from_mode(0o751)).unwrap();
        fs::create_dir(&root).unwrap();

        stack(&root, &[lower.clone(), upper]).unwrap();
        assert_eq!(fs::read_to_string(root.join("a/sub/f")).unwrap(), "lower");
        assert_eq!(fs::metadata(root.join("a")).unwrap().mode() & 0o7777, 0o751);
        assert!(!root.join("b").exists(), "whited out");
        assert_eq!(
            fs::read_link(root.join("c")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert!(!root.join("opq/old").exists() && !root.join("opq/gone").exists());
        assert_eq!(fs::read_to_string(root.join("opq/new")).unwrap(), "n");
        assert_eq!(
            fs::read_to_string(root.join("was-file/inside")).unwrap(),
            "i"
        );
        assert!(root.join("keep/k").is_file() && tmp.path().join("lower").is_dir());
        assert!(!root.join(".wh..").exists() && !root.join(".wh.b").exists());
        // Shared, not copied.
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();
        assert_eq!(ino(&root.join("keep/k")), ino(&lower.join("keep/k")));
    }
}
