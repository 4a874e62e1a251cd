//! The SIF reader: files made by Debian's siftool, and corrupt or hostile ones made here.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

use wharf_images::sif::{host_arch, primary_partition, primary_partition_of};
use wharf_images::ErrorKind;

/// One data-object descriptor of a test file.
#[derive(Debug, Clone, Copy)]
struct Obj {
    datatype: i32,
    used: bool,
    id: u32,
    group: u32,
    link: u32,
    offset: i64,
    size: i64,
    fstype: i32,
    parttype: i32,
    arch: &'static str,
}

const GROUP: u32 = 0xf000_0000;

/// The primary squashfs partition for this host, id 1, at `offset`+`size`.
fn part(offset: i64, size: i64) -> Obj {
    Obj {
        datatype: 0x4004,
        used: true,
        id: 1,
        group: GROUP | 1,
        link: 0,
        offset,
        size,
        fstype: 1,
        parttype: 2,
        arch: host_arch(),
    }
}

/// A generic data object (a signature, say) with `id`, linking to `link`.
fn obj(id: u32, link: u32, offset: i64, size: i64) -> Obj {
    Obj {
        datatype: 0x4005,
        id,
        link,
        offset,
        size,
        group: GROUP,
        fstype: 0,
        parttype: 0,
        arch: "",
        ..part(0, 0)
    }
}

/// Offsets of the header fields a test corrupts.
const FREE: usize = 80;
const DESC_SIZE: usize = 104;
const DATA_OFF: usize = 112;
const DATA_SIZE: usize = 120;

fn set(b: &mut [u8], at: usize, v: i64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// A SIF file of `file_len` bytes with `total` descriptors at `desc_off`, the first ones
/// `objs`; the header's counts and data section agree with them (the data section runs from
/// the table's end to the end of the file).
fn sif_objs(objs: &[Obj], total: i64, desc_off: i64, file_len: usize) -> Vec<u8> {
    let mut b = vec![0u8; file_len.max(128)];
    b[32..42].copy_from_slice(b"SIF_MAGIC\0");
    b[42..45].copy_from_slice(b"01\0");
    b[45..48].copy_from_slice(format!("{}\0", host_arch()).as_bytes());
    let used = objs.iter().filter(|o| o.used).count() as i64;
    let table = total.saturating_mul(585);
    let data_off = desc_off.saturating_add(table);
    set(&mut b, FREE, total - used);
    set(&mut b, 88, total);
    set(&mut b, 96, desc_off);
    set(&mut b, DESC_SIZE, table);
    set(&mut b, DATA_OFF, data_off);
    set(
        &mut b,
        DATA_SIZE,
        (file_len as i64).saturating_sub(data_off),
    );
    for (i, o) in objs.iter().enumerate() {
        let at = desc_off as usize + i * 585;
        if at + 585 > b.len() {
            break;
        }
        let d = &mut b[at..at + 585];
        d[0..4].copy_from_slice(&o.datatype.to_le_bytes());
        d[4] = u8::from(o.used);
        d[5..9].copy_from_slice(&o.id.to_le_bytes());
        d[9..13].copy_from_slice(&o.group.to_le_bytes());
        d[13..17].copy_from_slice(&o.link.to_le_bytes());
        d[17..25].copy_from_slice(&o.offset.to_le_bytes());
        d[25..33].copy_from_slice(&o.size.to_le_bytes());
        d[201..205].copy_from_slice(&o.fstype.to_le_bytes());
        d[205..209].copy_from_slice(&o.parttype.to_le_bytes());
        d[209..209 + o.arch.len()].copy_from_slice(o.arch.as_bytes());
    }
    b
}

/// [`sif_objs`] with one descriptor per `(datatype, used, offset, size, fstype, parttype,
/// arch)`, numbered from 1.
fn sif(
    descs: &[(i32, bool, i64, i64, i32, i32, &'static str)],
    total: i64,
    desc_off: i64,
    file_len: usize,
) -> Vec<u8> {
    let objs: Vec<Obj> = descs
        .iter()
        .enumerate()
        .map(
            |(i, &(datatype, used, offset, size, fstype, parttype, arch))| Obj {
                datatype,
                used,
                id: i as u32 + 1,
                offset,
                size,
                fstype,
                parttype,
                arch,
                ..part(0, 0)
            },
        )
        .collect();
    sif_objs(&objs, total, desc_off, file_len)
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
    assert!(e.message.starts_with(&p.display().to_string()), "{e}");
}

/// A usable SIF: a definition object, then the primary partition at 8192, 4096 bytes.
fn well_formed() -> Vec<u8> {
    sif(
        &[
            (0x4001, true, 4096, 10, 0, 0, ""),
            (0x4004, true, 8192, 4096, 1, 2, host_arch()),
        ],
        2,
        128,
        8192 + 4096,
    )
}

#[test]
fn reads_a_well_formed_file() {
    let b = well_formed();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.sif");
    std::fs::write(&p, b).unwrap();
    let part = primary_partition(&p).unwrap();
    assert_eq!((part.offset, part.size), (8192, 4096));
}

#[test]
fn links_to_objects_and_groups_are_accepted() {
    // A signature linking to the partition, another to the partition's group, unused slots.
    let objs = [
        part(8192, 4096),
        obj(2, 1, 4096, 100),
        obj(3, GROUP | 1, 4196, 100),
    ];
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.sif");
    std::fs::write(&p, sif_objs(&objs, 5, 128, 12288)).unwrap();
    assert_eq!(primary_partition(&p).unwrap().offset, 8192);
}

#[test]
fn reads_from_an_open_descriptor_by_position() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.sif");
    std::fs::write(&p, sif_objs(&[part(8192, 4096)], 1, 128, 12288)).unwrap();
    let file = std::fs::File::open(&p).unwrap();
    // The path is gone; the descriptor is what is read.
    std::fs::remove_file(&p).unwrap();
    let part = primary_partition_of(&file).unwrap();
    assert_eq!((part.offset, part.size), (8192, 4096));
    let mut first = [0u8; 1];
    file.read_exact_at(&mut first, 0).unwrap();
    use std::io::Seek;
    assert_eq!((&file).stream_position().unwrap(), 0, "offset left alone");

    let not_a_file = std::fs::File::open(dir.path()).unwrap();
    let err = primary_partition_of(&not_a_file).unwrap_err();
    assert!(err.message.contains("not a regular file"), "{err}");
}

#[test]
fn refuses_inconsistent_descriptor_tables() {
    let p = part(8192, 4096);
    let len = 12288;
    let table = |objs: &[Obj]| sif_objs(objs, 4, 128, len);
    check(&table(&[Obj { link: 1, ..p }]), "object 1 links to itself");
    check(
        &table(&[
            Obj { link: 2, ..p },
            obj(2, 3, 4096, 10),
            obj(3, 1, 4106, 10),
        ]),
        "cycle",
    );
    check(
        &table(&[p, obj(2, 9, 4096, 10)]),
        "links to object 9, which does not exist",
    );
    check(
        &table(&[p, obj(2, GROUP | 7, 4096, 10)]),
        "group 7, which has no objects",
    );
    check(
        &table(&[p, obj(1, 0, 4096, 10)]),
        "two descriptors have id 1",
    );
    check(&table(&[p, obj(0, 0, 4096, 10)]), "id 0");
    // Overlapping partitions, and a data object inside the partition.
    check(
        &table(&[
            p,
            Obj {
                id: 2,
                parttype: 3,
                offset: 10000,
                size: 2000,
                ..p
            },
        ]),
        "objects 1 and 2 overlap",
    );
    check(&table(&[p, obj(2, 0, 9000, 10)]), "overlap");
    // Data past the end of the file, or before the data section (over the table).
    check(
        &table(&[p, obj(2, 0, len as i64 - 5, 10)]),
        "lies outside the file",
    );
    check(&table(&[p, obj(2, 0, 200, 10)]), "outside the data section");
    check(&table(&[Obj { size: -5, ..p }]), "negative");

    // Header counts that disagree with the table.
    let mut b = table(&[p]);
    set(&mut b, FREE, 0);
    check(&b, "the header counts 0 free descriptors, the table has 3");
    let mut b = table(&[p]);
    set(&mut b, FREE, 9);
    check(&b, "free descriptors of 4");
    let mut b = table(&[p]);
    set(&mut b, DESC_SIZE, 585);
    check(&b, "descriptor table 585 bytes");
    let mut b = table(&[p]);
    set(&mut b, DATA_SIZE, len as i64);
    check(&b, "lies outside the file");
    let mut b = table(&[p]);
    set(&mut b, DATA_OFF, 200);
    check(&b, "overlaps the descriptor table");
    let mut b = table(&[p]);
    set(&mut b, DATA_OFF, -1);
    check(&b, "negative offset or size");
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
        "negative",
    );
    check(
        &sif(&[(0x4004, true, 8192, 0, 1, 2, arch)], 1, 128, 12288),
        "primary partition is 0 bytes",
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
    check(
        &sif(
            &[good, (0x4004, true, 4096, 4096, 1, 2, arch)],
            2,
            128,
            12288,
        ),
        "more than one primary",
    );
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

/// Runs `f` on a thread and returns its result, or fails the test if it has not returned
/// within 10 s (a blocking open would never return).
fn within_seconds<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(f()));
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("the SIF reader blocked opening the file")
}

#[test]
fn a_fifo_or_device_named_as_a_sif_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("x.sif");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    for no_follow in [false, true] {
        let p = fifo.clone();
        let e = within_seconds(move || {
            if no_follow {
                wharf_images::sif::primary_partition_no_follow(&p)
            } else {
                primary_partition(&p)
            }
        })
        .expect_err("a FIFO was accepted");
        assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
        assert!(e.message.contains("not a regular file"), "{e}");
        assert!(e.message.starts_with(&fifo.display().to_string()), "{e}");
    }
    // A symlink to one is refused as well, followed or not.
    let link = dir.path().join("link.sif");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    let p = link.clone();
    let e = within_seconds(move || primary_partition(&p)).expect_err("a FIFO was accepted");
    assert!(e.message.contains("not a regular file"), "{e}");
    let p = link.clone();
    let e = within_seconds(move || wharf_images::sif::primary_partition_no_follow(&p))
        .expect_err("a symlink was followed");
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    assert!(e.message.contains("symbolic link"), "{e}");
    let e = within_seconds(|| primary_partition(Path::new("/dev/null")))
        .expect_err("a device was accepted");
    assert!(e.message.contains("not a regular file"), "{e}");
}

/// Root reads a user's SIF by the path it checked: a directory on that path swapped for a
/// symlink since (here, to the real directory; in an attack, to `/proc/PID/root/...` of the
/// user's own mount namespace, where a device is bound) is refused, not followed, and
/// nothing but a regular file is ever opened. Before, only the last component was kept from
/// being a link, and the device's open ran as root.
#[test]
fn a_checked_path_with_a_link_swapped_into_it_is_refused_and_only_regular_files_are_opened() {
    let b = well_formed();
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::write(real.join("ok.sif"), b).unwrap();
    let swapped = dir.path().join("swapped");
    std::os::unix::fs::symlink(&real, &swapped).unwrap();
    let through = swapped.join("ok.sif");
    // Followed when the caller asks for it (the user's own tools), refused as root's.
    assert_eq!(primary_partition(&through).unwrap().offset, 8192);
    let e = wharf_images::sif::primary_partition_no_follow(&through)
        .expect_err("a link inside the path was followed");
    assert_eq!(e.kind, ErrorKind::InvalidInput, "{e}");
    assert!(e.message.contains("symbolic link"), "{e}");
    assert_eq!(
        wharf_images::sif::primary_partition_no_follow(&real.join("ok.sif"))
            .unwrap()
            .offset,
        8192
    );
    // A magic link of /proc is no way around it either.
    let magic = format!("/proc/self/root{}", real.join("ok.sif").display());
    assert!(wharf_images::sif::primary_partition_no_follow(Path::new(&magic)).is_err());
    // A device is refused without being opened (O_PATH runs no open routine).
    for no_follow in [false, true] {
        let e = if no_follow {
            wharf_images::sif::primary_partition_no_follow(Path::new("/dev/null"))
        } else {
            primary_partition(Path::new("/dev/null"))
        };
        assert!(e.unwrap_err().message.contains("not a regular file"));
    }
}
