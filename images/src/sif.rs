//! A reader for Apptainer/Singularity SIF files: enough to find the primary system partition
//! (a squashfs at some offset) that a job runs from. No Rust crate reads SIF, so Wharf does.
//!
//! Layout (little-endian, packed): a 128-byte global header (launch script, `SIF_MAGIC\0`,
//! version, architecture, uuid, times, descriptor counts, offsets, sizes), then a table of
//! 585-byte data-object descriptors. A partition descriptor's `extra` starts with the
//! filesystem type, the partition type and the architecture.
//!
//! The whole table is validated against the file before any partition is returned (and so
//! before anything is mounted): the header's counts and sizes agree with the table, every
//! used descriptor has its own non-zero id, its data lies inside the data section and inside
//! the file and overlaps no other object's, and links name existing descriptors or groups
//! without pointing at themselves or going round in a cycle. A corrupt or hostile file is
//! refused with a reason, never read out of bounds.
//!
//! The file is read by position from an open descriptor ([`primary_partition_of`]), so a
//! caller that opened it as the job's user can mount from the very descriptor it checked.

use std::collections::{HashMap, HashSet};
use std::fs::File;
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
/// Set in a group id, and in a link that names a group rather than a descriptor.
const GROUP_MASK: u32 = 0xf000_0000;

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

fn bad(why: impl std::fmt::Display) -> ImageError {
    ImageError {
        kind: ErrorKind::InvalidInput,
        message: format!("not a usable SIF file: {why}"),
    }
}

fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
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

/// Finds the primary system partition of the SIF file at `path`: opens it (as the caller,
/// following symlinks; see [`open`]) and runs [`primary_partition_of`]. Messages start
/// with the path.
///
/// Errors: `NotFound` for a missing file, `PermissionDenied` when the caller cannot read it,
/// `InvalidInput` for a file that is not a usable SIF (a FIFO or a device included, refused
/// without waiting on it), `Unavailable` for other IO errors.
pub fn primary_partition(path: &Path) -> Result<SifPartition, ImageError> {
    partition_at(path, false)
}

/// [`primary_partition`] for a path whose symlinks the caller has already resolved (and
/// checked): a symlink found there now was swapped in since, and is refused
/// (`InvalidInput`) rather than followed.
pub fn primary_partition_no_follow(path: &Path) -> Result<SifPartition, ImageError> {
    partition_at(path, true)
}

fn partition_at(path: &Path, no_follow: bool) -> Result<SifPartition, ImageError> {
    let file = open(path, no_follow)?;
    primary_partition_of(&file).map_err(|e| ImageError {
        kind: e.kind,
        message: format!("{}: {}", path.display(), e.message),
    })
}

/// Opens `path` for reading without ever opening anything but a regular file: the path is
/// resolved to an `O_PATH` descriptor (which opens nothing: no device's open routine runs,
/// no FIFO is waited on), that descriptor is checked with fstat, and only a regular file is
/// opened again, through it (`/proc/self/fd`), never by its path. With `no_follow` (root
/// reading a user's path, whose symlinks the caller resolved and checked), no symbolic link
/// and no `/proc` magic link is followed in any component: a directory swapped for a link
/// since the check is refused, not followed into another mount namespace's device.
fn open(path: &Path, no_follow: bool) -> Result<File, ImageError> {
    use nix::fcntl::{OFlag, ResolveFlag};
    let flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    let at = if no_follow {
        let how = nix::fcntl::OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        nix::fcntl::openat2(libc::AT_FDCWD, path, how)
    } else {
        nix::fcntl::open(path, flags, nix::sys::stat::Mode::empty())
    };
    let at = match at {
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(fd) => unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) },
        Err(nix::errno::Errno::ELOOP) if no_follow => {
            return Err(ImageError::invalid(format!(
                "{}: a part of it is now a symbolic link (it changed after it was checked); \
                 name the file itself",
                path.display()
            )))
        }
        Err(e) => return Err(ImageError::sys(path.display(), e)),
    };
    let st = nix::sys::stat::fstat(std::os::fd::AsRawFd::as_raw_fd(&at))
        .map_err(|e| ImageError::sys(path.display(), e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        let e = bad("not a regular file");
        return Err(ImageError {
            kind: e.kind,
            message: format!("{}: {}", path.display(), e.message),
        });
    }
    let again = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&at));
    match nix::fcntl::open(
        Path::new(&again),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(fd) => Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) }),
        Err(e) => Err(ImageError::sys(path.display(), e)),
    }
}

/// Finds the primary system partition of the SIF file open as `file`, reading by position
/// (the descriptor's offset is left alone), after validating the header and the whole
/// descriptor table against the file (see the module docs). The partition returned lies
/// inside the file as it was when read.
///
/// Errors: `InvalidInput` for anything but a regular file holding a usable SIF, with the
/// reason; `Unavailable` when reading fails.
pub fn primary_partition_of(file: &File) -> Result<SifPartition, ImageError> {
    let meta = file
        .metadata()
        .map_err(|e| ImageError::io("inspecting the SIF file", e))?;
    if !meta.is_file() {
        return Err(bad("not a regular file"));
    }
    let len = meta.len();
    let mut h = [0u8; HEADER_LEN];
    read_at(file, &mut h, 0).map_err(|_| bad("shorter than a SIF header"))?;
    let header = Header::parse(&h, len)?;
    let mut table = vec![0u8; header.table_len as usize];
    read_at(file, &mut table, header.desc_off)
        .map_err(|e| ImageError::io("reading the SIF descriptor table", e))?;
    let descs: Vec<Descriptor> = table
        .chunks_exact(DESCRIPTOR_LEN)
        .map(Descriptor::parse)
        .collect();
    validate_table(&header, &descs)?;
    primary(&descs)
}

fn read_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    file.read_exact_at(buf, offset)
}

/// The global header's fields that locate things, checked against each other and the file.
#[derive(Debug)]
struct Header {
    /// Descriptors marked unused, by the header's count.
    free: i64,
    /// Offset of the descriptor table.
    desc_off: u64,
    /// Bytes of the table: every descriptor, used or not.
    table_len: u64,
    /// The data section: where objects may lie.
    data: (u64, u64),
    /// Bytes in the file.
    len: u64,
}

impl Header {
    fn parse(h: &[u8; HEADER_LEN], len: u64) -> Result<Header, ImageError> {
        if &h[32..42] != MAGIC {
            return Err(bad("no SIF_MAGIC"));
        }
        if &h[42..45] != b"01\0" {
            return Err(bad(format!(
                "unsupported SIF version {:?}",
                arch_str(&h[42..45])
            )));
        }
        let (free, total) = (i64_at(h, 80), i64_at(h, 88));
        let (desc_off, desc_size) = (i64_at(h, 96), i64_at(h, 104));
        let (data_off, data_size) = (i64_at(h, 112), i64_at(h, 120));
        if !(1..=MAX_DESCRIPTORS).contains(&total) {
            return Err(bad(format!("descriptor count {total} out of range")));
        }
        if !(0..=total).contains(&free) {
            return Err(bad(format!(
                "the header counts {free} free descriptors of {total}"
            )));
        }
        let table_len = total as u64 * DESCRIPTOR_LEN as u64;
        if desc_size != table_len as i64 {
            return Err(bad(format!(
                "the header gives the descriptor table {desc_size} bytes, but {total} \
                 descriptors take {table_len}"
            )));
        }
        let table_end = match u64::try_from(desc_off) {
            Ok(off) if off >= HEADER_LEN as u64 => off.checked_add(table_len),
            _ => None,
        };
        let Some(table_end) = table_end.filter(|end| *end <= len) else {
            return Err(bad("descriptor table lies outside the file"));
        };
        let (Ok(data_start), Ok(size)) = (u64::try_from(data_off), u64::try_from(data_size)) else {
            return Err(bad(format!(
                "data section at {data_off}+{data_size} has a negative offset or size"
            )));
        };
        if data_start < table_end {
            return Err(bad(format!(
                "data section at {data_start} overlaps the descriptor table (up to {table_end})"
            )));
        }
        let Some(data_end) = data_start.checked_add(size).filter(|end| *end <= len) else {
            return Err(bad(format!(
                "data section at {data_start}+{size} lies outside the file ({len} bytes): it \
                 is truncated or corrupt"
            )));
        };
        Ok(Header {
            free,
            desc_off: desc_off as u64,
            table_len,
            data: (data_start, data_end),
            len,
        })
    }
}

/// One data-object descriptor.
#[derive(Debug)]
struct Descriptor {
    datatype: i32,
    used: bool,
    id: u32,
    group: u32,
    link: u32,
    offset: i64,
    size: i64,
    /// For partitions: filesystem type, partition type, architecture.
    fstype: i32,
    parttype: i32,
    arch: String,
}

impl Descriptor {
    fn parse(d: &[u8]) -> Descriptor {
        let extra = &d[201..];
        Descriptor {
            datatype: i32_at(d, 0),
            used: d[4] != 0,
            id: u32_at(d, 5),
            group: u32_at(d, 9),
            link: u32_at(d, 13),
            offset: i64_at(d, 17),
            size: i64_at(d, 25),
            fstype: i32_at(extra, 0),
            parttype: i32_at(extra, 4),
            arch: arch_str(&extra[8..11]),
        }
    }
}

/// Checks every used descriptor against the header, the file and the others.
fn validate_table(header: &Header, descs: &[Descriptor]) -> Result<(), ImageError> {
    let used: Vec<&Descriptor> = descs.iter().filter(|d| d.used).collect();
    let free = (descs.len() - used.len()) as i64;
    if free != header.free {
        return Err(bad(format!(
            "the header counts {} free descriptors, the table has {free}",
            header.free
        )));
    }
    let mut by_id = HashMap::new();
    let mut groups = HashSet::new();
    let mut extents = Vec::new();
    let (data_start, data_end) = header.data;
    for d in &used {
        if d.id == 0 {
            return Err(bad("a used descriptor has id 0, which names no object"));
        }
        if by_id.insert(d.id, *d).is_some() {
            return Err(bad(format!("two descriptors have id {}", d.id)));
        }
        if d.group & GROUP_MASK != 0 && d.group != GROUP_MASK {
            groups.insert(d.group);
        }
        let (Ok(offset), Ok(size)) = (u64::try_from(d.offset), u64::try_from(d.size)) else {
            return Err(bad(format!(
                "object {} at {}+{} has a negative offset or size",
                d.id, d.offset, d.size
            )));
        };
        let end = offset.checked_add(size);
        if end.is_none_or(|end| end > header.len) {
            return Err(bad(format!(
                "object {} at {offset}+{size} lies outside the file ({} bytes)",
                d.id, header.len
            )));
        }
        if offset < data_start || end.is_none_or(|end| end > data_end) {
            return Err(bad(format!(
                "object {} at {offset}+{size} lies outside the data section \
                 ({data_start}..{data_end})",
                d.id
            )));
        }
        if size > 0 {
            extents.push((offset, offset + size, d.id));
        }
    }
    extents.sort_unstable();
    for w in extents.windows(2) {
        let ((_, end, a), (start, _, b)) = (w[0], w[1]);
        if start < end {
            return Err(bad(format!("objects {a} and {b} overlap")));
        }
    }
    for d in &used {
        check_link(d, &by_id, &groups)?;
    }
    Ok(())
}

/// A link names nothing (0), an existing group, or an existing other descriptor, and
/// following descriptor links from `d` ends without coming back round.
fn check_link(
    d: &Descriptor,
    by_id: &HashMap<u32, &Descriptor>,
    groups: &HashSet<u32>,
) -> Result<(), ImageError> {
    let mut seen = HashSet::from([d.id]);
    let mut cur = d;
    loop {
        let link = cur.link;
        if link == 0 {
            return Ok(());
        }
        if link & GROUP_MASK != 0 {
            return if groups.contains(&link) {
                Ok(())
            } else {
                Err(bad(format!(
                    "object {} links to group {}, which has no objects",
                    cur.id,
                    link & !GROUP_MASK
                )))
            };
        }
        if link == cur.id {
            return Err(bad(format!("object {} links to itself", cur.id)));
        }
        let Some(next) = by_id.get(&link) else {
            return Err(bad(format!(
                "object {} links to object {link}, which does not exist",
                cur.id
            )));
        };
        if !seen.insert(link) {
            return Err(bad(format!(
                "object {}'s links go round in a cycle through object {link}",
                d.id
            )));
        }
        cur = next;
    }
}

/// The one used, squashfs, primary system partition for this host's architecture.
fn primary(descs: &[Descriptor]) -> Result<SifPartition, ImageError> {
    let mut found = None;
    for d in descs {
        if !d.used || d.datatype != DATATYPE_PARTITION || d.parttype != PARTTYPE_PRIMARY_SYSTEM {
            continue;
        }
        if found.is_some() {
            return Err(bad("more than one primary system partition"));
        }
        if d.size <= 0 {
            return Err(bad(format!("the primary partition is {} bytes", d.size)));
        }
        if d.fstype != FSTYPE_SQUASHFS {
            return Err(bad(format!(
                "primary partition has filesystem type {}; only squashfs (1) runs",
                d.fstype
            )));
        }
        // validate_table showed offset and size non-negative and inside the file.
        found = Some(SifPartition {
            offset: d.offset as u64,
            size: d.size as u64,
            arch: d.arch.clone(),
        });
    }
    let part = found.ok_or_else(|| bad("no primary system partition"))?;
    if !part.arch.is_empty() && part.arch != host_arch() {
        return Err(bad(format!(
            "built for SIF architecture {}, this node is {}",
            part.arch,
            host_arch()
        )));
    }
    Ok(part)
}
