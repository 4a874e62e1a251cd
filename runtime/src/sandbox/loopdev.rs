//! Attaching a byte range of a file (a SIF partition) to a read-only loop device that frees
//! itself when its last mount goes (LO_FLAGS_AUTOCLEAR), with one LOOP_CONFIGURE call.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use crate::error::{ErrorKind, RuntimeError};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` of linux/loop.h.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` of linux/loop.h.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device over `backing[offset..offset+size]`, read-only, autoclear: the very file the
/// caller opened (and checked), never a path opened again. The device stays attached while
/// the returned handle is open and until the last mount of it is gone.
pub(crate) fn attach(
    backing: &File,
    offset: u64,
    size: u64,
) -> Result<(PathBuf, File), RuntimeError> {
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| RuntimeError::io("/dev/loop-control (is the loop module loaded?)", e))?;
    // Another process may take the free device between the two calls: try again.
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(RuntimeError::io(
                "finding a free loop device",
                std::io::Error::last_os_error(),
            ));
        }
        let path = PathBuf::from(format!("/dev/loop{n}"));
        let dev = match OpenOptions::new().read(true).open(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(RuntimeError::io(path.display(), e)),
        };
        let cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: offset,
                lo_sizelimit: size,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR,
                lo_file_name: [0; 64],
                lo_crypt_name: [0; 64],
                lo_encrypt_key: [0; 32],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: a properly laid out loop_config that outlives the call.
        if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) } == 0 {
            return Ok((path, dev));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(RuntimeError::io(
                format!("configuring {}", path.display()),
                err,
            ));
        }
    }
    Err(RuntimeError::new(
        ErrorKind::Unavailable,
        "no free loop device after 16 tries",
    ))
}
