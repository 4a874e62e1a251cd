//! Limits against hostile or runaway input, and the running count kept against them.
//!
//! An import reads every archive twice (see [`crate::source`]): a scan that writes nothing
//! counts entries and declared file sizes, so a bomb is refused in the seconds it takes to
//! decompress it; then the unpack, which counts again against the same limits, because the
//! source could change between the two.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{ImageError, Result};

/// Bounds on what one import may consume; [`Limits::default`] suits real images (large CUDA
/// images run to tens of GiB in a few hundred thousand files). `wharf image import` sets the
/// first three with `--max-entries`, `--max-unpacked` and `--max-file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most archive entries in one import, all layers together.
    pub max_entries: u64,
    /// Most bytes of regular-file content written by one import, all layers together.
    pub max_unpacked_bytes: u64,
    /// Largest regular file, by the size its archive entry declares (a sparse file by the
    /// size it expands to).
    pub max_file_bytes: u64,
    /// Longest one import may take, the scan and the unpack together.
    pub max_duration: Duration,
    /// Largest `index.json`, `oci-layout`, manifest or config blob read into memory.
    pub max_json_bytes: u64,
    /// Most layers in one image manifest.
    pub max_layers: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 1_000_000,
            max_unpacked_bytes: 64 << 30,
            max_file_bytes: 8 << 30,
            max_duration: Duration::from_secs(30 * 60),
            max_json_bytes: 4 << 20,
            max_layers: 128,
        }
    }
}

/// Slack per entry on top of file content when bounding a decompressed tar stream: a header,
/// block padding and room for long-name and PAX records.
const STREAM_SLACK_PER_ENTRY: u64 = 4096;

impl Limits {
    /// Most bytes of decompressed tar stream read in one import. A backstop: the tar reader
    /// buffers long-name and PAX records in memory, and a stream of padding writes nothing
    /// that the other limits would count.
    pub(crate) fn max_stream_bytes(&self) -> u64 {
        self.max_unpacked_bytes
            .saturating_add(self.max_entries.saturating_mul(STREAM_SLACK_PER_ENTRY))
    }
}

/// What one import has used so far.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    limits: Limits,
    /// When the import must be over.
    deadline: Option<Instant>,
    /// Entries seen.
    pub entries: u64,
    /// Regular-file bytes written.
    pub bytes: u64,
    /// Decompressed tar stream bytes read.
    pub stream_bytes: u64,
}

impl Budget {
    /// A fresh budget under `limits`.
    pub fn new(limits: Limits) -> Self {
        Budget {
            limits,
            deadline: Instant::now().checked_add(limits.max_duration),
            entries: 0,
            bytes: 0,
            stream_bytes: 0,
        }
    }

    /// The limits this budget counts against.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Counts one more entry.
    pub fn add_entry(&mut self) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(ImageError::invalid(format!(
                "image has more than {} entries (the limit per image); refused as an archive \
                 bomb (if the image is genuine, raise the limit: --max-entries)",
                self.limits.max_entries
            )));
        }
        self.check_time()
    }

    /// Checks, before any byte of it is read, a regular file whose entry declares `size`
    /// bytes: against the per-file limit and against what is left of the per-image one.
    pub fn check_file(&self, entry: &Path, size: u64) -> Result<()> {
        if size > self.limits.max_file_bytes {
            return Err(ImageError::invalid(format!(
                "entry '{}' is {size} bytes, over the limit of {} per file; refused as an \
                 archive bomb (if the image is genuine, raise the limit: --max-file)",
                entry.display(),
                self.limits.max_file_bytes
            )));
        }
        if self.bytes.saturating_add(size) > self.limits.max_unpacked_bytes {
            return Err(self.over_total());
        }
        Ok(())
    }

    /// Counts `n` more bytes of file content.
    pub fn add_bytes(&mut self, n: u64) -> Result<()> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.limits.max_unpacked_bytes {
            return Err(self.over_total());
        }
        self.check_time()
    }

    fn over_total(&self) -> ImageError {
        ImageError::invalid(format!(
            "image unpacks to more than {} bytes (the limit per image); refused as an archive \
             bomb (if the image is genuine, raise the limit: --max-unpacked)",
            self.limits.max_unpacked_bytes
        ))
    }

    /// Fails once the import has run longer than [`Limits::max_duration`].
    pub fn check_time(&self) -> Result<()> {
        match self.deadline {
            Some(d) if Instant::now() > d => Err(ImageError::invalid(format!(
                "import took longer than the limit of {} s; refused",
                self.limits.max_duration.as_secs()
            ))),
            _ => Ok(()),
        }
    }

    /// Adds what `after` spent since `before` (a clone of this budget's state that work ran
    /// on, in parallel with others) to this budget; fails when the sum is over the limits.
    pub fn absorb(&mut self, before: &Budget, after: &Budget) -> Result<()> {
        self.entries += after.entries.saturating_sub(before.entries);
        self.stream_bytes = self
            .stream_bytes
            .saturating_add(after.stream_bytes.saturating_sub(before.stream_bytes));
        if self.entries > self.limits.max_entries {
            // Counting the last one again gives the error that names the limit.
            self.entries -= 1;
            return self.add_entry();
        }
        self.add_bytes(after.bytes.saturating_sub(before.bytes))
    }

    /// How many more bytes of decompressed stream this import may read.
    pub fn stream_allowance(&self) -> u64 {
        self.limits
            .max_stream_bytes()
            .saturating_sub(self.stream_bytes)
    }

    /// Counts `n` bytes of decompressed stream read (at most the allowance, which the reader
    /// enforced).
    pub fn spend_stream(&mut self, n: u64) {
        self.stream_bytes = self.stream_bytes.saturating_add(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_refuses_past_the_limit() {
        let limits = Limits {
            max_entries: 2,
            max_unpacked_bytes: 10,
            ..Limits::default()
        };
        let mut b = Budget::new(limits);
        b.add_entry().unwrap();
        b.add_entry().unwrap();
        assert_eq!(
            b.add_entry().unwrap_err().kind,
            crate::ErrorKind::InvalidInput
        );
        b.check_file(Path::new("f"), 10).unwrap();
        b.add_bytes(10).unwrap();
        assert!(b.check_file(Path::new("g"), 1).is_err());
        assert!(b.add_bytes(1).is_err());
        b.spend_stream(limits.max_stream_bytes() - 5);
        assert_eq!(b.stream_allowance(), 5);
    }

    #[test]
    fn absorbs_work_done_in_parallel_and_refuses_the_sum_over_the_limit() {
        let limits = Limits {
            max_entries: 10,
            max_unpacked_bytes: 100,
            ..Limits::default()
        };
        let mut total = Budget::new(limits);
        let before = total.clone();
        let (mut a, mut b) = (before.clone(), before.clone());
        for _ in 0..4 {
            a.add_entry().unwrap();
            b.add_entry().unwrap();
        }
        a.add_bytes(60).unwrap();
        b.add_bytes(30).unwrap();
        total.absorb(&before, &a).unwrap();
        total.absorb(&before, &b).unwrap();
        assert_eq!((total.entries, total.bytes), (8, 90));
        let mut c = before.clone();
        c.add_bytes(20).unwrap();
        assert!(total
            .absorb(&before, &c)
            .unwrap_err()
            .message
            .contains("per image"));
        let mut d = before.clone();
        for _ in 0..3 {
            d.add_entry().unwrap();
        }
        let mut t2 = Budget::new(limits);
        t2.absorb(&before, &a).unwrap();
        t2.absorb(&before, &b).unwrap();
        assert!(t2
            .absorb(&before, &d)
            .unwrap_err()
            .message
            .contains("entries"));
    }

    #[test]
    fn refuses_large_files_and_overtime() {
        let limits = Limits {
            max_file_bytes: 100,
            max_duration: Duration::ZERO,
            ..Limits::default()
        };
        let b = Budget::new(limits);
        assert!(b.check_file(Path::new("f"), 100).is_ok());
        let err = b.check_file(Path::new("f"), 101).unwrap_err();
        assert!(err.message.contains("per file"), "{err}");
        std::thread::sleep(Duration::from_millis(2));
        assert!(b.check_time().unwrap_err().message.contains("longer"));
    }
}
