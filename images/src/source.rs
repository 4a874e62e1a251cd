//! The three kinds of import source, each unpacked through the same extractor.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::dirsource::with_tar_stream;
use crate::error::{ImageError, Result};
use crate::extract::{apply_stream, scan_stream, Whiteouts};
use crate::limits::Budget;
use crate::oci::{layer_compression, Descriptor, Layout};
use crate::rootfs::RootDir;
use crate::stream::{decompress, finish_stream, sniff, CapReader, HashingReader};

const READ_BUF: usize = 256 << 10;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A rootfs tarball, plain, gzip or zstd.
    Tarball(PathBuf),
    /// A directory holding a root filesystem.
    Directory(PathBuf),
    /// An OCI image layout, with the tag to pick.
    OciLayout { dir: PathBuf, tag: Option<String> },
}

impl Source {
    /// Tells what `source` is: an OCI layout (`DIR` or `DIR:TAG`), another directory, or a
    /// file taken as a tarball.
    pub fn classify(source: &Path) -> Result<Source> {
        match std::fs::metadata(source) {
            Ok(m) if m.is_dir() && crate::oci::is_layout(source) => Ok(Source::OciLayout {
                dir: source.to_path_buf(),
                tag: None,
            }),
            Ok(m) if m.is_dir() => Ok(Source::Directory(source.to_path_buf())),
            Ok(m) if m.is_file() => Ok(Source::Tarball(source.to_path_buf())),
            Ok(_) => Err(ImageError::invalid(format!(
                "{} is neither a file nor a directory",
                source.display()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match split_tag(source) {
                Some((dir, tag)) if crate::oci::is_layout(&dir) => Ok(Source::OciLayout {
                    dir,
                    tag: Some(tag),
                }),
                _ => Err(ImageError::not_found(format!(
                    "{} does not exist; give a tarball (.tar, .tar.gz, .tar.zst), a directory \
                     holding a root filesystem, or an OCI layout as DIR or DIR:TAG",
                    source.display()
                ))),
            },
            Err(e) => Err(ImageError::io(source.display(), e)),
        }
    }

    /// The kind, as recorded in [`crate::ImageInfo::source`].
    pub fn kind(&self) -> &'static str {
        match self {
            Source::Tarball(_) => "tarball",
            Source::Directory(_) => "directory",
            Source::OciLayout { .. } => "oci-layout",
        }
    }

    /// Unpacks into `root`; returns the image digest: SHA-256 of the uncompressed tar stream
    /// for a tarball or directory, the manifest digest for an OCI layout.
    ///
    /// An archive (a tarball, each layer) is first scanned, writing nothing, against the
    /// limits (see [`crate::limits`]); a directory is the node's own and is not.
    pub fn unpack(&self, root: &RootDir, budget: &mut Budget) -> Result<String> {
        match self {
            Source::Tarball(path) => {
                let open = || -> Result<Box<dyn Read>> {
                    let file = File::open(path).map_err(|e| ImageError::io(path.display(), e))?;
                    let (kind, raw) = sniff(BufReader::with_capacity(READ_BUF, file))?;
                    decompress(kind, raw)
                };
                let mut scan = budget.clone();
                with_tar(open()?, &mut scan, "the tarball", |s, b| scan_stream(s, b))?;
                with_tar(open()?, budget, "the tarball", |s, b| {
                    apply_stream(root, s, Whiteouts::Literal, b)
                })
            }
            Source::Directory(dir) => with_tar_stream(dir, |stream| {
                with_tar(stream, budget, "the directory's archive", |s, b| {
                    apply_stream(root, s, Whiteouts::Literal, b)
                })
            }),
            Source::OciLayout { dir, tag } => unpack_layout(root, dir, tag.as_deref(), budget),
        }
    }
}

/// `DIR:TAG` split at the last colon, if the tag part could be a tag.
fn split_tag(source: &Path) -> Option<(PathBuf, String)> {
    let (dir, tag) = source.to_str()?.rsplit_once(':')?;
    if dir.is_empty() || tag.is_empty() || tag.contains('/') {
        return None;
    }
    Some((PathBuf::from(dir), tag.to_string()))
}

/// Runs `read` (a scan or an unpack) over the uncompressed tar stream `stream`, capped by the
/// budget, then reads the stream to its end ([`finish_stream`]); returns the SHA-256 of all
/// of it, the image's `diff_id`.
pub(crate) fn with_tar(
    stream: impl Read,
    budget: &mut Budget,
    what: &'static str,
    read: impl FnOnce(&mut dyn Read, &mut Budget) -> Result<()>,
) -> Result<String> {
    let mut capped = CapReader::new(stream, budget.stream_allowance(), what);
    let mut hashed = HashingReader::new(&mut capped);
    let res = read(&mut hashed, budget).and_then(|()| finish_stream(&mut hashed, what));
    let digest = hashed.digest();
    budget.spend_stream(capped.count());
    res.map(|()| digest)
}

/// Scans then unpacks the chosen manifest's layers, bottom first; returns the manifest
/// digest.
fn unpack_layout(
    root: &RootDir,
    dir: &Path,
    tag: Option<&str>,
    budget: &mut Budget,
) -> Result<String> {
    let layout = Layout::open(dir, budget.limits().max_json_bytes)?;
    let resolved = layout.resolve(tag, budget.limits().max_layers)?;
    let in_layer = |i: usize, desc: &Descriptor, e: ImageError| {
        ImageError::new(
            e.kind,
            format!("layer {} ({}): {}", i + 1, desc.digest, e.message),
        )
    };
    let check_diff = |diff: String, diff_id: &str| {
        if diff == diff_id {
            return Ok(());
        }
        Err(ImageError::invalid(format!(
            "uncompressed content hashes to {diff}, but the image config's diff_id for it is \
             {diff_id}; the image is corrupt or was tampered with"
        )))
    };
    let layers = || resolved.layers.iter().zip(&resolved.diff_ids).enumerate();
    // The scan checks both digests too, so a tampered layer is refused before anything is
    // written; the unpack checks them again, as the blobs could change in between.
    let mut scan = budget.clone();
    for (i, (desc, diff_id)) in layers() {
        read_layer(&layout, desc, &mut scan, |s, b| scan_stream(s, b))
            .and_then(|diff| check_diff(diff, diff_id))
            .map_err(|e| in_layer(i, desc, e))?;
    }
    for (i, (desc, diff_id)) in layers() {
        read_layer(&layout, desc, budget, |s, b| {
            apply_stream(root, s, Whiteouts::Apply, b)
        })
        .and_then(|diff| check_diff(diff, diff_id))
        .map_err(|e| in_layer(i, desc, e))?;
    }
    Ok(resolved.digest)
}

/// Runs `read` over layer `desc`, decompressed, checking the blob against its digest as it
/// streams; returns the digest of the uncompressed stream.
fn read_layer(
    layout: &Layout,
    desc: &Descriptor,
    budget: &mut Budget,
    read: impl FnOnce(&mut dyn Read, &mut Budget) -> Result<()>,
) -> Result<String> {
    let file = layout.open_blob(desc)?;
    read_blob(file, desc, budget, read)
}

/// Runs `read` over the layer blob `blob` (a file or a download), decompressed as `desc`'s
/// media type says, checking that the blob is `desc.size` bytes hashing to `desc.digest`;
/// returns the digest of the uncompressed stream. Nothing after `desc.size` bytes is read.
pub(crate) fn read_blob(
    blob: impl Read,
    desc: &Descriptor,
    budget: &mut Budget,
    read: impl FnOnce(&mut dyn Read, &mut Budget) -> Result<()>,
) -> Result<String> {
    let compression = layer_compression(&desc.media_type)?;
    let mut raw = HashingReader::new(BufReader::with_capacity(READ_BUF, blob).take(desc.size));
    let diff = decompress(compression, &mut raw)
        .and_then(|stream| with_tar(stream, budget, "the layer", read));
    // Read the rest either way: when reading failed, a digest mismatch is the better reason.
    let drained = raw.drain();
    let complete = raw.len() == desc.size;
    let read_len = raw.len();
    let digest = raw.digest();
    if drained.is_ok() && (!complete || digest != desc.digest) {
        let got = if complete {
            format!("content hashes to {digest}")
        } else {
            format!("it ended after {read_len} of its {} bytes", desc.size)
        };
        return Err(ImageError::invalid(format!(
            "blob does not match its digest ({got}); the blob is corrupt or was tampered with"
        )));
    }
    let diff = diff?;
    drained.map_err(|e| ImageError::io("reading the layer blob", e))?;
    Ok(diff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tags() {
        assert_eq!(
            split_tag(Path::new("/x/img:v1")),
            Some(("/x/img".into(), "v1".into()))
        );
        assert_eq!(split_tag(Path::new("/x/img")), None);
        assert_eq!(split_tag(Path::new("/x:y/img")), None);
        assert_eq!(split_tag(Path::new("img:")), None);
    }
}
