//! A directory import, as a tar stream: the tree is archived on a thread into a pipe that the
//! extractor reads, so a directory gets exactly the checks a tarball gets.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::error::{ErrorKind, ImageError, Result};

/// Runs `consume` on a tar stream of `dir` (sorted, so the same tree gives the same stream),
/// produced concurrently. Sockets are left out: they cannot be archived.
pub(crate) fn with_tar_stream<T>(
    dir: &Path,
    consume: impl FnOnce(&mut dyn Read) -> Result<T>,
) -> Result<T> {
    let (r, w) = nix::unistd::pipe().map_err(|e| ImageError::sys("creating a pipe", e))?;
    let mut reader = File::from(r);
    let writer = File::from(w);
    std::thread::scope(|s| {
        let producer = s.spawn(move || write_tree(dir, writer));
        let consumed = consume(&mut reader);
        // Unblocks the producer if the consumer stopped early.
        drop(reader);
        let produced = producer.join().unwrap_or_else(|_| {
            Err(io::Error::other(
                "the thread archiving the directory panicked",
            ))
        });
        match (consumed, produced) {
            // The producer failing (an unreadable file) explains a truncated stream; a broken
            // pipe only echoes the consumer's own error.
            (_, Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => {
                Err(ImageError::io(format!("archiving {}", dir.display()), e))
            }
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(ImageError::new(ErrorKind::Unavailable, e.to_string())),
            (Ok(t), Ok(())) => Ok(t),
        }
    })
}

/// Writes `dir` as a tar stream into `out`, depth first, names sorted.
fn write_tree(dir: &Path, out: File) -> io::Result<()> {
    let mut builder = tar::Builder::new(BufWriter::with_capacity(256 << 10, out));
    builder.follow_symlinks(false);
    builder.mode(tar::HeaderMode::Complete);
    let mut stack = children(dir, Path::new(""))?;
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", abs.display()));
        let kind = fs::symlink_metadata(&abs).map_err(with_path)?.file_type();
        if kind.is_socket() {
            continue;
        }
        builder
            .append_path_with_name(&abs, &rel)
            .map_err(with_path)?;
        if kind.is_dir() {
            stack.extend(children(&abs, &rel)?);
        }
    }
    builder.into_inner()?.flush()
}

/// The entries of `abs` as paths under `rel`, in reverse name order (for popping).
fn children(abs: &Path, rel: &Path) -> io::Result<Vec<PathBuf>> {
    let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", abs.display()));
    let mut names = fs::read_dir(abs)
        .map_err(with_path)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<Vec<_>>>()
        .map_err(with_path)?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names.into_iter().map(|n| rel.join(n)).collect())
}
