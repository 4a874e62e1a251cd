//! Applying one tar stream, a rootfs tarball or an image layer, to a [`RootDir`].
//!
//! Every entry path is normalized ([`crate::entry_path`]) and written by [`RootDir`], which
//! resolves it inside the root. In a layer, OCI whiteouts delete from the layers below:
//! `.wh.NAME` removes `NAME`, `.wh..wh..opq` empties its directory. Both apply to lower layers
//! only, and a tar stream may list a whiteout after entries of the same layer, so the layer
//! remembers what it wrote and spares it.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use tar::EntryType;

use crate::entry_path::{check_link_target, normalize, show};
use crate::error::{ImageError, Result};
use crate::limits::Budget;
use crate::rootfs::{Meta, RootDir};

/// Prefix of a whiteout file name.
const WHITEOUT: &[u8] = b".wh.";
/// Name of the opaque-directory marker.
const OPAQUE: &[u8] = b".wh..wh..opq";
/// Prefix of other aufs metadata (`.wh..wh.plnk`, ...), which is not content.
const AUFS_META: &[u8] = b".wh..wh.";

/// Whether whiteout names are instructions (image layers) or ordinary files (a rootfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Whiteouts {
    /// Written as files with those names.
    Literal,
    /// Applied to what the layers below left.
    Apply,
}

/// What a layer has written so far, so its own whiteouts spare it.
#[derive(Debug, Default)]
struct LayerState {
    /// Paths written, with all their ancestors.
    touched: HashSet<PathBuf>,
    /// Paths written explicitly.
    written: HashSet<PathBuf>,
}

impl LayerState {
    fn record(&mut self, path: &Path) {
        self.written.insert(path.to_path_buf());
        for p in path.ancestors() {
            if p.as_os_str().is_empty() || !self.touched.insert(p.to_path_buf()) {
                break;
            }
        }
    }
}

/// A whiteout entry, decoded.
enum Whiteout {
    /// Remove this path from the lower layers.
    Remove(PathBuf),
    /// Empty this directory of lower-layer content.
    Opaque(PathBuf),
    /// aufs bookkeeping: nothing to do.
    Ignore,
}

fn whiteout(path: &Path) -> Result<Option<Whiteout>> {
    let Some(name) = path.file_name().map(OsStr::as_bytes) else {
        return Ok(None);
    };
    if !name.starts_with(WHITEOUT) {
        return Ok(None);
    }
    let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    if name == OPAQUE {
        return Ok(Some(Whiteout::Opaque(dir)));
    }
    if name.starts_with(AUFS_META) {
        return Ok(Some(Whiteout::Ignore));
    }
    let hidden = &name[WHITEOUT.len()..];
    if hidden.is_empty() || hidden == b"." || hidden == b".." {
        return Err(ImageError::invalid(format!(
            "layer entry '{}' is a whiteout of nothing",
            path.display()
        )));
    }
    Ok(Some(Whiteout::Remove(dir.join(OsStr::from_bytes(hidden)))))
}

/// Reads every entry of the tar stream `stream` into `root`, counting against `budget`.
pub(crate) fn apply_stream(
    root: &RootDir,
    stream: impl Read,
    whiteouts: Whiteouts,
    budget: &mut Budget,
) -> Result<()> {
    let mut archive = tar::Archive::new(stream);
    let entries = archive
        .entries()
        .map_err(|e| ImageError::stream("reading the archive", e))?;
    let mut layer = (whiteouts == Whiteouts::Apply).then(LayerState::default);
    let mut buf = vec![0u8; 256 << 10];
    for entry in entries {
        let mut entry = entry.map_err(|e| ImageError::stream("reading the archive", e))?;
        budget.add_entry()?;
        apply_entry(root, &mut entry, layer.as_mut(), budget, &mut buf)?;
    }
    Ok(())
}

/// Reads every entry header of the tar stream `stream`, writing nothing, and counts entries
/// and declared file sizes against `budget`: a bomb is refused before anything is unpacked,
/// at the cost of reading the stream (not the disk) once more. Content is skipped unread
/// where the reader can seek, read and dropped otherwise.
pub(crate) fn scan_stream(stream: impl Read, budget: &mut Budget) -> Result<()> {
    let mut archive = tar::Archive::new(stream);
    let entries = archive
        .entries()
        .map_err(|e| ImageError::stream("reading the archive", e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ImageError::stream("reading the archive", e))?;
        budget.add_entry()?;
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse
        ) {
            let raw = entry.path_bytes();
            budget.check_file(Path::new(OsStr::from_bytes(&raw)), entry.size())?;
            budget.add_bytes(entry.size())?;
        }
    }
    Ok(())
}

fn apply_entry<R: Read>(
    root: &RootDir,
    entry: &mut tar::Entry<'_, R>,
    layer: Option<&mut LayerState>,
    budget: &mut Budget,
    buf: &mut [u8],
) -> Result<()> {
    let kind = entry.header().entry_type();
    if kind.is_pax_global_extensions() {
        return Ok(());
    }
    let raw = entry.path_bytes().into_owned();
    let path = normalize(&raw)
        .map_err(|why| ImageError::invalid(format!("entry {}: {why}", show(&raw))))?;
    if let Some(state) = layer {
        if let Some(wh) = whiteout(&path)? {
            return match wh {
                Whiteout::Remove(p) if state.written.contains(&p) => Ok(()),
                Whiteout::Remove(p) => root.remove(&p),
                Whiteout::Opaque(dir) => root.prune(&dir, &state.touched),
                Whiteout::Ignore => Ok(()),
            };
        }
        state.record(&path);
    }
    let meta = meta_of(entry.header(), &path)?;
    // Old (v7) archives mark directories only by a trailing slash.
    let is_dir =
        kind == EntryType::Directory || (kind == EntryType::Regular && raw.ends_with(b"/"));
    if path.as_os_str().is_empty() && !is_dir {
        return Err(ImageError::invalid(format!(
            "entry {} names the root but is not a directory",
            show(&raw)
        )));
    }
    match kind {
        _ if is_dir => root.make_dir(&path, &meta),
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
            budget.check_file(&path, entry.size())?;
            root.write_file(&path, &meta, entry, budget, buf)
        }
        EntryType::Symlink => {
            let target = link_name(entry, &path)?;
            check_link_target(&target)
                .map_err(|why| ImageError::invalid(format!("entry '{}': {why}", path.display())))?;
            root.make_symlink(&path, OsStr::from_bytes(&target), &meta)
        }
        EntryType::Link => {
            let target = link_name(entry, &path)?;
            let target = normalize(&target).map_err(|why| {
                ImageError::invalid(format!(
                    "entry '{}': hard link target: {why}",
                    path.display()
                ))
            })?;
            root.make_hardlink(&path, &target)
        }
        // Devices are the sandbox's business (it bind-mounts the allowed ones); FIFOs and
        // anything unknown are not worth a special case in a read-only image.
        _ => Ok(()),
    }
}

fn link_name<R: Read>(entry: &tar::Entry<'_, R>, path: &Path) -> Result<Vec<u8>> {
    entry
        .link_name_bytes()
        .map(|b| b.into_owned())
        .ok_or_else(|| {
            ImageError::invalid(format!(
                "entry '{}' is a link without a target",
                path.display()
            ))
        })
}

fn meta_of(header: &tar::Header, path: &Path) -> Result<Meta> {
    let bad = |field: &str, e: &dyn std::fmt::Display| {
        ImageError::invalid(format!("entry '{}': bad {field}: {e}", path.display()))
    };
    let mode = header.mode().map_err(|e| bad("mode", &e))?;
    let id = |v: std::io::Result<u64>, field: &str| -> Result<u32> {
        let v = v.map_err(|e| bad(field, &e))?;
        u32::try_from(v).map_err(|e| bad(field, &e))
    };
    Ok(Meta {
        mode,
        uid: id(header.uid(), "uid")?,
        gid: id(header.gid(), "gid")?,
        mtime: header.mtime().ok().and_then(|t| i64::try_from(t).ok()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_whiteouts() {
        let w = |p: &str| whiteout(Path::new(p));
        assert!(w("a/b").unwrap().is_none());
        assert!(
            matches!(w("a/.wh.b").unwrap(), Some(Whiteout::Remove(p)) if p == Path::new("a/b"))
        );
        assert!(matches!(w(".wh.b").unwrap(), Some(Whiteout::Remove(p)) if p == Path::new("b")));
        assert!(
            matches!(w("a/.wh..wh..opq").unwrap(), Some(Whiteout::Opaque(p)) if p == Path::new("a"))
        );
        assert!(matches!(
            w("a/.wh..wh.plnk").unwrap(),
            Some(Whiteout::Ignore)
        ));
        assert!(w("a/.wh.").is_err());
        assert!(w("a/.wh...").is_err());
    }

    #[test]
    fn records_ancestors() {
        let mut s = LayerState::default();
        s.record(Path::new("a/b/c"));
        for p in ["a", "a/b", "a/b/c"] {
            assert!(s.touched.contains(Path::new(p)), "{p}");
        }
        assert!(s.written.contains(Path::new("a/b/c")));
        assert!(!s.written.contains(Path::new("a")));
    }
}
