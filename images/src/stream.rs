//! Byte streams around the archives: compression sniffing, digests while reading, and caps.

use std::io::{self, Cursor, Read};

use flate2::read::MultiGzDecoder;
use sha2::{Digest, Sha256};

use crate::error::{ImageError, Result};

/// How a tar stream is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    /// Plain tar.
    None,
    /// gzip, possibly several members.
    Gzip,
    /// Zstandard.
    Zstd,
}

/// Reads the first bytes of `r` to tell its compression by magic number, and returns a reader
/// that still yields every byte. A file extension can lie; the magic cannot.
pub(crate) fn sniff<R: Read>(mut r: R) -> Result<(Compression, impl Read)> {
    let mut head = [0u8; 6];
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ImageError::stream("reading the tarball", e)),
        }
    }
    let kind = match &head[..n] {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Zstd,
        [0xfd, b'7', b'z', b'X', b'Z', 0] => {
            return Err(ImageError::invalid(
                "tarball is xz-compressed; use a plain, gzip or zstd tarball",
            ))
        }
        [b'B', b'Z', b'h', ..] => {
            return Err(ImageError::invalid(
                "tarball is bzip2-compressed; use a plain, gzip or zstd tarball",
            ))
        }
        _ => Compression::None,
    };
    Ok((kind, Cursor::new(head[..n].to_vec()).chain(r)))
}

/// Wraps `r` in the decompressor for `kind`.
pub(crate) fn decompress<'a, R: Read + 'a>(kind: Compression, r: R) -> Result<Box<dyn Read + 'a>> {
    Ok(match kind {
        Compression::None => Box::new(r),
        Compression::Gzip => Box::new(MultiGzDecoder::new(r)),
        Compression::Zstd => Box::new(
            zstd::stream::read::Decoder::new(r)
                .map_err(|e| ImageError::io("starting the zstd decoder", e))?,
        ),
    })
}

/// Most bytes accepted after a tar archive's end-of-archive block: the rest of its record
/// (tar pads to 10 KiB records by default, to 1 MiB with `tar -b 2048`).
pub(crate) const MAX_TRAILER: u64 = 1 << 20;

/// Reads what is left of `r` once the tar reader has stopped at the end-of-archive block, so
/// that a decompressor checks its trailer (gzip CRC and length, zstd checksum) and refuses
/// bytes after the compressed stream, and a digest over `r` covers the whole stream. More
/// than [`MAX_TRAILER`] bytes is refused: nothing legitimate lies there.
pub(crate) fn finish_stream(r: &mut impl Read, what: &str) -> Result<()> {
    let left = io::copy(&mut r.take(MAX_TRAILER + 1), &mut io::sink()).map_err(|e| {
        let what = format!(
            "{what} is corrupt at its end (a bad checksum, a truncated stream, or bytes after \
             the compressed stream)"
        );
        ImageError::stream(what, e)
    })?;
    if left > MAX_TRAILER {
        return Err(ImageError::invalid(format!(
            "{what} goes on for more than {MAX_TRAILER} bytes after the end of its tar archive"
        )));
    }
    Ok(())
}

/// `sha256:<hex>` of `bytes`.
pub(crate) fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A reader that hashes (SHA-256) and counts every byte that passes through it.
#[derive(Debug)]
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    len: u64,
}

impl<R: Read> HashingReader<R> {
    /// Wraps `inner`.
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// Reads what is left, so that the digest covers the whole stream (a tar reader stops at
    /// the end-of-archive blocks; a decompressor may leave trailing bytes).
    pub fn drain(&mut self) -> io::Result<u64> {
        io::copy(self, &mut io::sink())
    }

    /// Bytes read so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// `sha256:<hex>` of everything read.
    pub fn digest(self) -> String {
        format!("sha256:{}", hex::encode(self.hasher.finalize()))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// A reader that fails, rather than truncating, once more than `limit` bytes come through.
#[derive(Debug)]
pub(crate) struct CapReader<R> {
    inner: R,
    left: u64,
    limit: u64,
    what: &'static str,
}

impl<R: Read> CapReader<R> {
    /// Wraps `inner`; `what` names the stream in the error.
    pub fn new(inner: R, limit: u64, what: &'static str) -> Self {
        CapReader {
            inner,
            left: limit,
            limit,
            what,
        }
    }

    /// Bytes read so far.
    pub fn count(&self) -> u64 {
        self.limit - self.left
    }
}

impl<R: Read> Read for CapReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            let msg = format!(
                "{} is larger than the limit of {} bytes",
                self.what, self.limit
            );
            return Err(ImageError::invalid(msg).into_io());
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sniffed(bytes: &[u8]) -> Result<(Compression, Vec<u8>)> {
        let (kind, mut r) = sniff(bytes)?;
        let mut all = Vec::new();
        r.read_to_end(&mut all).unwrap();
        Ok((kind, all))
    }

    #[test]
    fn sniffs_magic_and_keeps_every_byte() {
        assert_eq!(
            sniffed(b"\x1f\x8b\x08rest").unwrap(),
            (Compression::Gzip, b"\x1f\x8b\x08rest".to_vec())
        );
        assert_eq!(sniffed(b"\x28\xb5\x2f\xfdzz").unwrap().0, Compression::Zstd);
        assert_eq!(sniffed(b"ab").unwrap(), (Compression::None, b"ab".to_vec()));
        assert!(sniffed(b"\xfd7zXZ\0...").is_err());
        assert!(sniffed(b"BZh91AY").is_err());
    }

    #[test]
    fn hashes_and_caps() {
        let mut h = HashingReader::new(&b"hello"[..]);
        h.drain().unwrap();
        assert_eq!(h.len(), 5);
        assert_eq!(h.digest(), sha256_digest(b"hello"));
        let mut c = CapReader::new(&b"hello"[..], 4, "stream");
        let err = io::copy(&mut c, &mut io::sink()).unwrap_err();
        assert_eq!(
            ImageError::stream("x", err).kind,
            crate::ErrorKind::InvalidInput
        );
        let mut c = CapReader::new(&b"hello"[..], 5, "stream");
        io::copy(&mut c, &mut io::sink()).unwrap();
        assert_eq!(c.count(), 5);
    }

    #[test]
    fn finishing_checks_the_trailer_and_bounds_what_is_left() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, &[0u8; 4096]).unwrap();
        let gz = gz.finish().unwrap();
        let finish = |bytes: &[u8]| finish_stream(&mut MultiGzDecoder::new(bytes), "layer");
        finish(&gz).unwrap();
        let mut bad_crc = gz.clone();
        let at = bad_crc.len() - 8;
        bad_crc[at] ^= 1;
        assert!(finish(&bad_crc).unwrap_err().message.contains("checksum"));
        let mut trailing = gz.clone();
        trailing.extend_from_slice(b"junk");
        assert!(finish(&trailing).unwrap_err().message.contains("corrupt"));
        let mut long = io::repeat(0).take(MAX_TRAILER + 1);
        let err = finish_stream(&mut long, "layer").unwrap_err();
        assert!(err.message.contains("more than"), "{err}");
    }
}
