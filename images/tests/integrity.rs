//! Integrity and bombs: every byte of a layer is checked against both of its digests (the
//! blob's, and the config's diff_id of the uncompressed stream), a compressed stream must end
//! cleanly, and archives built to exhaust the node are refused within seconds. Each refusal
//! leaves the store as it was.

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{gzip, scratch, sha256, zstd, Layout, Scratch, Tar, LAYER_GZIP, LAYER_ZSTD};
use wharf_images::ErrorKind;

/// A small rootfs archive.
fn small() -> Vec<u8> {
    Tar::new()
        .dir("etc/")
        .file("etc/hostname", b"box\n")
        .bytes()
}

/// Imports `source` expecting `InvalidInput` whose message holds `expect`; checks that the
/// store is as it was (no image, nothing in progress).
fn refused(s: &Scratch, source: &std::path::Path, expect: &str) {
    let err = s.store.import(source, "bad").unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidInput, "{err}");
    assert!(err.message.contains(expect), "{expect:?} not in: {err}");
    assert!(s.store.list().unwrap().is_empty());
    s.assert_no_leftovers();
}

/// A layout with one layer of `media` whose blob is `blob`; diff_id `diff` (else the true one).
fn one_layer(s: &Scratch, media: &str, blob: Vec<u8>, diff: Option<String>) -> std::path::PathBuf {
    let layout = Layout::new(s.work.join(format!("layout-{}", sha256(&blob))));
    let manifest = match diff {
        Some(d) => layout.manifest_with_diff_ids(&[(media, blob)], &[d]),
        None => layout.manifest(&[(media, blob)]),
    };
    layout.index(vec![manifest]);
    layout.dir
}

#[test]
fn gzip_with_a_bad_crc_is_refused() {
    let s = scratch();
    let mut bad = gzip(&small());
    // The trailer is CRC-32 then length, little-endian, in the last 8 bytes.
    let at = bad.len() - 8;
    bad[at] ^= 0x01;
    let tarball = s.put("crc.tar.gz", &bad);
    refused(&s, &tarball, "checksum");
    // As a layer the blob digest matches (it is of the corrupt bytes); the CRC does not.
    let dir = one_layer(&s, LAYER_GZIP, bad, Some(sha256(&small())));
    refused(&s, &dir, "checksum");
}

#[test]
fn bytes_after_the_compressed_stream_are_refused() {
    let s = scratch();
    for (name, media, mut blob) in [
        ("g.tar.gz", LAYER_GZIP, gzip(&small())),
        ("z.tar.zst", LAYER_ZSTD, zstd(&small())),
    ] {
        blob.extend_from_slice(b"hidden trailing bytes");
        refused(&s, &s.put(name, &blob), "after the compressed stream");
        let dir = one_layer(&s, media, blob, Some(sha256(&small())));
        refused(&s, &dir, "after the compressed stream");
    }
    // Intact, the same streams import.
    s.store
        .import(&one_layer(&s, LAYER_ZSTD, zstd(&small()), None), "ok")
        .unwrap();
}

#[test]
fn layer_not_matching_its_diff_id_is_refused() {
    let s = scratch();
    // The blob matches the manifest's digest; its content is not what the config pins.
    let other = Tar::new().file("etc/hostname", b"other\n").bytes();
    let dir = one_layer(&s, LAYER_GZIP, gzip(&small()), Some(sha256(&other)));
    refused(&s, &dir, "diff_id");

    // A config that does not list one diff_id per layer, or a malformed one.
    let layout = Layout::new(s.work.join("counts"));
    let layers = [(LAYER_GZIP, gzip(&small())), (LAYER_GZIP, gzip(&other))];
    layout.index(vec![
        layout.manifest_with_diff_ids(&layers, &[sha256(&small())])
    ]);
    refused(&s, &layout.dir, "1 diff_ids for the manifest's 2 layers");
    layout.index(vec![layout.manifest_with_diff_ids(
        &layers[..1],
        &["sha256:../../etc/passwd".to_string()],
    )]);
    refused(&s, &layout.dir, "malformed");

    // The true diff_ids import.
    layout.index(vec![layout.manifest(&layers)]);
    let info = s.store.import(&layout.dir, "ok").unwrap();
    assert_eq!(
        std::fs::read(info.rootfs.join("etc/hostname")).unwrap(),
        b"other\n"
    );
}

/// The tar header of a regular file of `size` bytes, owned by root.
fn file_header(path: &str, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_path(path).unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    h
}

/// A gzip stream of `header`, then `zeros` zero bytes, then the end-of-archive blocks, made of
/// concatenated members so that it costs one compression of 64 MiB, not of `zeros` bytes.
fn gzip_of_header_and_zeros(header: &[u8], zeros: u64) -> Vec<u8> {
    const CHUNK: u64 = 64 << 20;
    assert_eq!(zeros % CHUNK, 0);
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(&vec![0u8; CHUNK as usize]).unwrap();
    let chunk = enc.finish().unwrap();
    let mut out = gzip(header);
    for _ in 0..zeros / CHUNK {
        out.extend_from_slice(&chunk);
    }
    out.extend_from_slice(&gzip(&[0u8; 1024]));
    out
}

/// Checks that `source` was refused with `expect` in well under `bound`.
fn refused_within(s: &Scratch, source: &std::path::Path, expect: &str, bound: Duration) {
    let started = Instant::now();
    refused(s, source, expect);
    let took = started.elapsed();
    assert!(took < bound, "took {took:?} to refuse (bound {bound:?})");
    eprintln!("refused {} in {took:?}", source.display());
}

#[test]
fn ten_gib_of_zeros_in_one_file_is_refused_within_seconds() {
    let s = scratch();
    let size = 10u64 << 30;
    let h = file_header("zeros", size);
    let blob = gzip_of_header_and_zeros(h.as_bytes(), size);
    assert!(blob.len() < 20 << 20, "{} bytes", blob.len());
    // Old code wrote the 10 GiB before anything could stop it: minutes, and the disk.
    let bound = Duration::from_secs(20);
    refused_within(&s, &s.put("zeros.tar.gz", &blob), "per file", bound);
    // Its true diff_id would take minutes to compute here; the scan refuses first.
    let dir = one_layer(&s, LAYER_GZIP, blob, Some(sha256(b"unknown")));
    refused_within(&s, &dir, "per file", bound);
}

#[test]
fn a_million_entries_are_refused_within_seconds() {
    let s = scratch();
    // 1,001,000 distinct empty files in 1001 directories, compressed as they are made.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for d in 0..1001 {
        let mut thousand = Vec::with_capacity(512 * 1000);
        for f in 0..1000 {
            thousand.extend_from_slice(file_header(&format!("d{d}/f{f}"), 0).as_bytes());
        }
        enc.write_all(&thousand).unwrap();
    }
    enc.write_all(&[0u8; 1024]).unwrap();
    let blob = enc.finish().unwrap();
    // Old code unpacked a million files (minutes) before the count stopped it, then deleted
    // them; the scan refuses in the time it takes to decompress 500 MB of headers.
    let bound = Duration::from_secs(30);
    let dir = one_layer(&s, LAYER_GZIP, blob, Some(sha256(b"unknown")));
    refused_within(&s, &dir, "entries", bound);
}

#[test]
fn an_import_over_its_time_limit_is_refused_and_leaves_nothing() {
    let limits = wharf_images::Limits {
        max_duration: Duration::ZERO,
        ..wharf_images::Limits::default()
    };
    // The clock starts when the import does; its first entry is already late.
    let s = common::scratch_with(limits);
    refused(
        &s,
        &s.put("t.tar.gz", &gzip(&small())),
        "longer than the limit",
    );
    let dir = one_layer(&s, LAYER_GZIP, gzip(&small()), None);
    refused(&s, &dir, "longer than the limit");
}
