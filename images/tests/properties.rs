//! Property tests of the parsers that read user input: SIF headers and descriptor tables, and
//! tar entries. Bounded (case counts below) so each runs in a few seconds on two cores.

mod common;

use std::fs;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use tar::EntryType;
use wharf_images::sif::{host_arch, primary_partition_of};

/// `cases` cases, and no failure files written into the source tree (a failure prints its
/// minimal input).
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------- SIF

const HEADER: usize = 128;
const DESC: usize = 585;

/// A valid SIF file: a 4-descriptor table at 128, a signature (id 2, linked to the
/// partition) and the primary partition (id 1), data section up to the end of the file.
fn valid_sif() -> Vec<u8> {
    let (desc_off, total) = (HEADER, 4usize);
    let data_off = desc_off + total * DESC;
    let len = 16384;
    let mut b = vec![0u8; len];
    b[32..42].copy_from_slice(b"SIF_MAGIC\0");
    b[42..45].copy_from_slice(b"01\0");
    let put = |b: &mut [u8], at: usize, v: i64| b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    for (at, v) in [
        (80, 2),
        (88, total as i64),
        (96, desc_off as i64),
        (104, (total * DESC) as i64),
        (112, data_off as i64),
        (120, (len - data_off) as i64),
    ] {
        put(&mut b, at, v);
    }
    for (i, (dt, id, link, off, size)) in [
        (0x4004i32, 1u32, 0u32, 8192i64, 8192i64),
        (0x4005, 2, 1, 4096, 64),
    ]
    .into_iter()
    .enumerate()
    {
        let d = &mut b[desc_off + i * DESC..desc_off + (i + 1) * DESC];
        d[0..4].copy_from_slice(&dt.to_le_bytes());
        d[4] = 1;
        d[5..9].copy_from_slice(&id.to_le_bytes());
        d[9..13].copy_from_slice(&0xf000_0001u32.to_le_bytes());
        d[13..17].copy_from_slice(&link.to_le_bytes());
        d[17..25].copy_from_slice(&off.to_le_bytes());
        d[25..33].copy_from_slice(&size.to_le_bytes());
        if dt == 0x4004 {
            d[201..205].copy_from_slice(&1i32.to_le_bytes());
            d[205..209].copy_from_slice(&2i32.to_le_bytes());
            d[209..211].copy_from_slice(host_arch().as_bytes());
        }
    }
    b
}

/// Runs the parser on `bytes` from an open (unnamed) file; checks that whatever it accepts
/// lies inside the file, past the header.
fn parse_sif(bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(bytes).unwrap();
    f.rewind().unwrap();
    if let Ok(p) = primary_partition_of(&f) {
        prop_assert!(p.size > 0);
        prop_assert!(p.offset >= HEADER as u64);
        prop_assert!(p
            .offset
            .checked_add(p.size)
            .is_some_and(|e| e <= bytes.len() as u64));
    }
    Ok(())
}

/// Values that break parsers: signs, bounds, the file's own length.
fn nasty_i64() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(-1),
        Just(i64::MIN),
        Just(i64::MAX),
        Just(16384),
        Just(16383),
        Just(128),
        Just(585),
        any::<i64>(),
        0i64..20000,
    ]
}

/// Offsets of every 8-byte header field and of every numeric field of the first descriptors.
fn field_offset() -> impl Strategy<Value = usize> {
    let header = (10usize..16).prop_map(|i| i * 8);
    let desc = (
        0usize..4,
        prop::sample::select(vec![0usize, 5, 9, 13, 17, 25, 33, 201, 205]),
    )
        .prop_map(|(i, f)| HEADER + i * DESC + f);
    prop_oneof![header, desc]
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn sif_arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..3000)) {
        parse_sif(&bytes)?;
    }

    #[test]
    fn sif_arbitrary_bytes_after_a_valid_header_never_panic(
        tail in prop::collection::vec(any::<u8>(), 0..4000),
    ) {
        let mut b = valid_sif();
        b.truncate(HEADER);
        b.extend_from_slice(&tail);
        parse_sif(&b)?;
    }

    #[test]
    fn sif_mutated_valid_files_never_escape(
        fields in prop::collection::vec((field_offset(), nasty_i64()), 0..4),
        bytes in prop::collection::vec((0usize..16384, any::<u8>()), 0..8),
        cut in prop::option::of(0usize..16384),
    ) {
        let mut b = valid_sif();
        for (at, v) in fields {
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        for (at, v) in bytes {
            b[at] = v;
        }
        if let Some(n) = cut {
            b.truncate(n);
        }
        parse_sif(&b)?;
    }
}

#[test]
fn the_valid_sif_is_accepted() {
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(&valid_sif()).unwrap();
    let p = primary_partition_of(&f).unwrap();
    assert_eq!((p.offset, p.size), (8192, 8192));
}

// ---------------------------------------------------------------- tar entries

/// Stands for the absolute path of the directory outside the store, in generated names.
const OUT: &str = "@OUT";

/// Path components: a few names that entries share (so later ones go through what earlier
/// ones made), and ones that attack: climbing, absolute, into the host, whiteouts, odd bytes.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        16 => prop::sample::select(vec!["a", "b"]).prop_map(String::from),
        2 => Just(OUT.to_string()),
        1 => Just("..".to_string()),
        1 => Just(".".to_string()),
        1 => Just(String::new()),
        1 => Just(".wh..wh..opq".to_string()),
        1 => Just(".wh.a".to_string()),
        1 => "[a-c.]{1,3}",
    ]
}

fn path() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(component(), 1..4)).prop_map(|(abs, parts)| {
        let p = parts.join("/");
        if abs {
            format!("/{p}")
        } else {
            p
        }
    })
}

/// Link targets: mostly the host directory outside, or climbing towards it.
fn target() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just(OUT.to_string()),
        1 => Just(format!("{OUT}/a")),
        1 => Just("../../../../../..".to_string()),
        2 => path(),
    ]
}

fn kind() -> impl Strategy<Value = EntryType> {
    prop_oneof![
        6 => Just(EntryType::Regular),
        4 => Just(EntryType::Directory),
        6 => Just(EntryType::Symlink),
        1 => Just(EntryType::Link),
        1 => prop::sample::select(vec![
            EntryType::Char,
            EntryType::Fifo,
            EntryType::GNUSparse,
            EntryType::new(b'Z'),
        ]),
    ]
}

type Entry = (EntryType, String, String, u32);

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    prop::collection::vec((kind(), path(), target(), 0u32..0o10000), 1..10)
}

/// The archive of `entries`, `@OUT` replaced by `out`; names and link targets over 100 bytes
/// are cut (a GNU header's fields).
fn archive(entries: &[Entry], out: &Path) -> Vec<u8> {
    let out = out.to_str().unwrap();
    let mut b = tar::Builder::new(Vec::new());
    for (kind, name, link, mode) in entries {
        let name = name.replace(OUT, out);
        let link = link.replace(OUT, out);
        let data: &[u8] = if *kind == EntryType::Regular {
            b"data"
        } else {
            b""
        };
        let mut h = tar::Header::new_gnu();
        let gnu = h.as_gnu_mut().unwrap();
        let (n, l) = (name.len().min(100), link.len().min(100));
        gnu.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        gnu.linkname[..l].copy_from_slice(&link.as_bytes()[..l]);
        h.set_entry_type(*kind);
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// Every path under `dir`, symlinks not followed.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            all.push(e.path());
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            }
        }
    }
    all
}

/// Imports `entries` as a tarball and as the top of two OCI layers over `lower`; checks that
/// nothing was written outside the store, and that an accepted image holds its files under
/// its root and nothing is left in progress.
fn import_contained(lower: &[Entry], entries: &[Entry]) -> Result<(), TestCaseError> {
    let s = common::scratch();
    let victim = s.outside.join("victim");
    fs::write(&victim, b"untouched").unwrap();
    let tar = archive(entries, &s.outside);
    let layout = common::Layout::new(s.work.join("layout"));
    layout.index(vec![layout.manifest(&[
        (common::LAYER_TAR, archive(lower, &s.outside)),
        (common::LAYER_TAR, tar.clone()),
    ])]);
    let tarball = s.put("t.tar", &tar);
    let work = walk(&s.work);
    let results = [
        s.store.import(&tarball, "tarball"),
        s.store.import(&layout.dir, "layers"),
    ];
    prop_assert_eq!(fs::read(&victim).unwrap(), b"untouched");
    prop_assert_eq!(walk(&s.outside), vec![victim.clone()]);
    prop_assert_eq!(walk(&s.work), work);
    let images = s.store.root().join("images");
    for p in walk(s.store.root()) {
        // The pull's directories stay empty: an import writes only under `images/`.
        let ok = p.starts_with(&images)
            || ["tmp", "layers", "roots", "locks", "meta"]
                .iter()
                .any(|d| p == s.store.root().join(d));
        prop_assert!(ok, "{} is outside every image", p.display());
    }
    for info in results.into_iter().flatten() {
        prop_assert!(info.rootfs.starts_with(&images));
        prop_assert!(fs::symlink_metadata(&info.rootfs).unwrap().is_dir());
    }
    for dir in fs::read_dir(&images).unwrap() {
        let dir = dir.unwrap().path();
        for p in walk(&dir) {
            let under_root = p.starts_with(dir.join("rootfs"))
                || p == dir.join("rootfs")
                || p == dir.join("image.json");
            prop_assert!(under_root, "{} is not under the image's root", p.display());
        }
    }
    s.assert_no_leftovers();
    Ok(())
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn tar_entries_never_write_outside_the_root(lower in entries(), upper in entries()) {
        import_contained(&lower, &upper)?;
    }
}
