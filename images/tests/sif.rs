//! The SIF reader: files made by Debian's siftool, and corrupt or hostile ones made here.

use std::path::Path;
use std::process::Command;

use wharf_images::sif::{host_arch, primary_partition};
use wharf_images::ErrorKind;

/// A SIF file with one descriptor per `(datatype, used, offset, size, fstype, parttype, arch)`.
fn sif(
    descs: &[(i32, bool, i64, i64, i32, i32, &str)],
    total: i64,
    desc_off: i64,
    file_len: usize,
) -> Vec<u8> {
    let mut b = vec![0u8; file_len.max(128)];
    b[32..42].copy_from_slice(b"SIF_MAGIC\0");
    b[42..45].copy_from_slice(b"01\0");
    b[45..48].copy_from_slice(format!("{}\0", host_arch()).as_bytes());
    b[88..96].copy_from_slice(&total.to_le_bytes());
    b[96..104].copy_from_slice(&desc_off.to_le_bytes());
    for (i, (dt, used, off, size, fs, pt, arch)) in descs.iter().enumerate() {
        let at = desc_off as usize + i * 585;
        if at + 585 > b.len() {
            break;
        }
        let d = &mut b[at..at + 585];
        d[0..4].copy_from_slice(&dt.to_le_bytes());
        d[4] = u8::from(*used);
        d[17..25].copy_from_slice(&off.to_le_bytes());
        d[25..33].copy_from_slice(&size.to_le_bytes());
        d[201..205].copy_from_slice(&fs.to_le_bytes());
        d[205..209].copy_from_slice(&pt.to_le_bytes());
        d[209..209 + arch.len()].copy_from_slice(arch.as_bytes());
    }
    b
}

fn check(bytes: &[u8], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.sif");
    std::fs::write(&p, bytes).unwrap();
    let e = primary_partition(&p).expect_err("accepted a bad SIF");
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    assert!(
        e.message.contains(expect),
        "{expect:?} not in {:?}",
        e.message
    );
}

#[test]
fn reads_a_well_formed_file() {
    let arch = host_arch();
    let b = sif(
        &[
            (0x4001, true, 4096, 10, 0, 0, ""),
            (0x4004, true, 8192, 4096, 1, 2, arch),
        ],
        2,
        128,
        8192 + 4096,
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.sif");
    std::fs::write(&p, b).unwrap();
    let part = primary_partition(&p).unwrap();
    assert_eq!((part.offset, part.size), (8192, 4096));
}

#[test]
fn refuses_corrupt_and_hostile_files() {
    let arch = host_arch();
    let good = (0x4004, true, 8192, 4096, 1, 2, arch);
    check(b"not a sif", "shorter than a SIF header");
    let mut b = sif(&[good], 1, 128, 12288);
    b[32] = b'X';
    check(&b, "no SIF_MAGIC");
    check(&sif(&[good], 1_000_000_000, 128, 12288), "descriptor count");
    check(&sif(&[good], -1, 128, 12288), "descriptor count");
    check(
        &sif(&[good], 48, 128, 12288),
        "descriptor table lies outside",
    );
    check(
        &sif(&[good], 1, i64::MAX - 10, 12288),
        "descriptor table lies outside",
    );
    check(
        &sif(&[(0x4004, true, 8192, 1 << 40, 1, 2, arch)], 1, 128, 12288),
        "lies outside the file",
    );
    check(
        &sif(&[(0x4004, true, i64::MAX, 10, 1, 2, arch)], 1, 128, 12288),
        "lies outside the file",
    );
    check(
        &sif(&[(0x4004, true, 8192, -5, 1, 2, arch)], 1, 128, 12288),
        "lies outside the file",
    );
    check(
        &sif(&[(0x4004, true, 8192, 4096, 2, 2, arch)], 1, 128, 12288),
        "only squashfs",
    );
    check(
        &sif(&[(0x4004, false, 8192, 4096, 1, 2, arch)], 1, 128, 12288),
        "no primary system partition",
    );
    check(
        &sif(&[(0x4004, true, 8192, 4096, 1, 3, arch)], 1, 128, 12288),
        "no primary system partition",
    );
    check(&sif(&[good, good], 2, 128, 12288), "more than one primary");
    let other = if arch == "04" { "02" } else { "04" };
    check(
        &sif(&[(0x4004, true, 8192, 4096, 1, 2, other)], 1, 128, 12288),
        "built for SIF architecture",
    );
}

#[test]
fn reads_a_file_made_by_siftool() {
    let tools = ["siftool", "mksquashfs"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !tools {
        let why = "reads_a_file_made_by_siftool: needs siftool and mksquashfs (apt-get install siftool squashfs-tools)";
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::write(root.join("bin/hello"), "hi").unwrap();
    let sif_path = dir.path().join("img.sif");
    let mksif = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mksif.sh");
    // One fixed build time for both squashfs builds below: their superblocks record it, and
    // two builds a second apart would differ there.
    let epoch = ("SOURCE_DATE_EPOCH", "1700000000");
    run(Command::new(mksif)
        .arg(&root)
        .arg(&sif_path)
        .env(epoch.0, epoch.1));
    // The same tree as a plain squashfs, to compare the partition with.
    let sqfs = dir.path().join("root.sqfs");
    run(Command::new("mksquashfs")
        .arg(&root)
        .arg(&sqfs)
        .args(["-noappend", "-quiet", "-all-root"])
        .env(epoch.0, epoch.1));
    let part = primary_partition(&sif_path).unwrap();
    assert_eq!(part.size, std::fs::metadata(&sqfs).unwrap().len());
    // The partition is the squashfs, byte for byte.
    let all = std::fs::read(&sif_path).unwrap();
    assert_eq!(
        &all[part.offset as usize..(part.offset + part.size) as usize],
        &std::fs::read(&sqfs).unwrap()[..]
    );
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
