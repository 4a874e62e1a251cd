//! A reader for Apptainer/Singularity SIF files: enough to find the primary system partition
//! (a squashfs at some offset) that a job runs from. No Rust crate reads SIF, so Wharf does.
//!
//! Layout (little-endian, packed): a 128-byte global header (launch script, `SIF_MAGIC\0`,
//! version, architecture, uuid, times, descriptor counts, offsets, sizes), then a table of
//! 585-byte data-object descriptors. A partition descriptor's `extra` starts with the
//! filesystem type, the partition type and the architecture. Every count, offset and size is
//! checked against the file before it is used, so a corrupt or hostile file is refused with a
//! reason, never read out of bounds.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{ErrorKind, ImageError};

const HEADER_LEN: usize = 128;
const DESCRIPTOR_LEN: usize = 585;
const MAGIC: &[u8; 10] = b"SIF_MAGIC\0";
/// Most descriptors accepted (Apptainer makes 48 by default).
const MAX_DESCRIPTORS: i64 = 4096;
const DATATYPE_PARTITION: i32 = 0x4004;
const PARTTYPE_PRIMARY_SYSTEM: i32 = 2;
const FSTYPE_SQUASHFS: i32 = 1;

/// The partition a job runs from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SifPartition {
    /// Byte offset of the squashfs in the file.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
    /// SIF architecture code of the partition (`"02"` = amd64).
    pub arch: String,
}

fn bad(path: &Path, why: impl std::fmt::Display) -> ImageError {
    let at = if path.as_os_str().is_empty() {
        String::new()
    } else {
        format!("{}: ", path.display())
    };
    ImageError {
        kind: ErrorKind::InvalidInput,
        message: format!("{at}not a usable SIF file: {why}"),
    }
}

/// `Read` and `Seek` over positioned reads of a shared `&File`.
struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

impl Seek for ReadAt<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        match to {
            SeekFrom::Start(at) => self.at = at,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "only absolute seeks",
                ))
            }
        }
        Ok(self.at)
    }
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn arch_str(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .trim_end_matches('\0')
        .to_string()
}

/// The SIF architecture code of this machine.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86" => "01",
        "x86_64" => "02",
        "arm" => "03",
        "aarch64" => "04",
        "powerpc64" => "05",
        "riscv64" => "12",
        _ => "",
    }
}

/// The partition a job runs from (the name [`primary_partition_of`] returns).
pub type Partition = SifPartition;
/// Why a SIF file cannot be used.
pub type SifError = ImageError;

/// Finds the primary system partition of the SIF file at `path`.
pub fn primary_partition(path: &Path) -> Result<SifPartition, ImageError> {
    let f = File::open(path).map_err(|e| ImageError {
        kind: if e.kind() == std::io::ErrorKind::NotFound {
            ErrorKind::NotFound
        } else {
            ErrorKind::Unavailable
        },
        message: format!("{}: {e}", path.display()),
    })?;
    primary_partition_of(&f).map_err(|e| ImageError {
        message: format!("{}: {}", path.display(), e.message),
        ..e
    })
}

/// Finds the primary system partition of the SIF file open at `file`, read with positioned
/// reads (the descriptor's offset is left alone). What a caller checks and what it mounts are
/// then one file: it opened it, this reads it, and the loop device is given the same
/// descriptor.
pub fn primary_partition_of(file: &File) -> Result<Partition, SifError> {
    let mut f = ReadAt { file, at: 0 };
    let path = Path::new("");
    let len = file.metadata().map_err(|e| bad(path, e))?.len();
    let mut h = [0u8; HEADER_LEN];
    f.read_exact(&mut h)
        .map_err(|_| bad(path, "shorter than a SIF header"))?;
    if &h[32..42] != MAGIC {
        return Err(bad(path, "no SIF_MAGIC"));
    }
    if &h[42..45] != b"01\0" {
        return Err(bad(
            path,
            format!("unsupported SIF version {:?}", arch_str(&h[42..45])),
        ));
    }
    let total = i64_at(&h, 88);
    let desc_off = i64_at(&h, 96);
    if !(1..=MAX_DESCRIPTORS).contains(&total) {
        return Err(bad(path, format!("descriptor count {total} out of range")));
    }
    let table = total as u64 * DESCRIPTOR_LEN as u64;
    if desc_off < HEADER_LEN as i64
        || (desc_off as u64)
            .checked_add(table)
            .is_none_or(|end| end > len)
    {
        return Err(bad(path, "descriptor table lies outside the file"));
    }
    f.seek(SeekFrom::Start(desc_off as u64))
        .map_err(|e| bad(path, e))?;
    let mut descs = vec![0u8; table as usize];
    f.read_exact(&mut descs).map_err(|e| bad(path, e))?;
    let mut found = None;
    for d in descs.chunks_exact(DESCRIPTOR_LEN) {
        let (datatype, used) = (i32_at(d, 0), d[4] != 0);
        let extra = &d[201..];
        if !used || datatype != DATATYPE_PARTITION || i32_at(extra, 4) != PARTTYPE_PRIMARY_SYSTEM {
            continue;
        }
        if found.is_some() {
            return Err(bad(path, "more than one primary system partition"));
        }
        let (offset, size) = (i64_at(d, 17), i64_at(d, 25));
        if offset < HEADER_LEN as i64
            || size <= 0
            || (offset as u64)
                .checked_add(size as u64)
                .is_none_or(|end| end > len)
        {
            return Err(bad(
                path,
                format!("partition at {offset}+{size} lies outside the file ({len} bytes)"),
            ));
        }
        let fstype = i32_at(extra, 0);
        if fstype != FSTYPE_SQUASHFS {
            return Err(bad(
                path,
                format!("primary partition has filesystem type {fstype}; only squashfs (1) runs"),
            ));
        }
        found = Some(SifPartition {
            offset: offset as u64,
            size: size as u64,
            arch: arch_str(&extra[8..11]),
        });
    }
    let part = found.ok_or_else(|| bad(path, "no primary system partition"))?;
    if !part.arch.is_empty() && part.arch != host_arch() {
        return Err(bad(
            path,
            format!(
                "built for SIF architecture {}, this node is {}",
                part.arch,
                host_arch()
            ),
        ));
    }
    Ok(part)
}
