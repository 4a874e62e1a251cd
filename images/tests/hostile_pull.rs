//! Hostile images pulled from a registry: each case is served by a registry written in the
//! test (a real one will not store a blob that does not match its digest), pulled into a
//! fresh store within a time limit, and must either be refused with a named error or be
//! unpacked safely; either way nothing is written outside the store, and a refused pull
//! leaves no root, no name, no hostile layer and nothing in progress behind it.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use common::served::{config_json, descriptor, manifest_json, Served, CONFIG};
use common::*;
use tar::EntryType;
use wharf_images::registry::RegistryOptions;
use wharf_images::{ErrorKind, ImageInfo, Limits};

/// Longest a hostile pull may take: a hang is a failure.
const TIME_LIMIT: Duration = Duration::from_secs(60);

/// What a case must come to.
enum Expect {
    /// Refused as invalid input, the message holding each of these.
    Refused(&'static [&'static str]),
    /// Pulled; the root passes this check.
    Pulled(fn(&Path, &Path)),
}

/// What a case serves: layers (media type, blob) and, when not the layers' true ones, the
/// config's diff_ids; or a whole hand-made manifest.
enum Image {
    Layers(Vec<(&'static str, Vec<u8>)>, Option<Vec<String>>),
    /// A manifest over these layer descriptors, the blobs served under the given digests.
    Raw {
        descs: Vec<serde_json::Value>,
        blobs: Vec<(String, Vec<u8>)>,
        diff_ids: Vec<String>,
    },
}

struct Case {
    name: &'static str,
    /// Builds the image, given the directory that escapes aim at.
    image: fn(&Path) -> Image,
    limits: Limits,
    expect: Expect,
}

fn tar_layer(tar: Vec<u8>) -> Image {
    Image::Layers(vec![(LAYER_TAR, tar)], None)
}

fn gz_layer(tar: Vec<u8>) -> Image {
    Image::Layers(vec![(LAYER_GZIP, gzip(&tar))], None)
}

fn two_layers(lower: Vec<u8>, upper: Vec<u8>) -> Image {
    Image::Layers(vec![(LAYER_TAR, lower), (LAYER_TAR, upper)], None)
}

fn out(outside: &Path, name: &str) -> String {
    outside.join(name).to_str().unwrap().to_string()
}

/// A PAX extended header record `key=value`.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = [key.as_bytes(), b"=", value, b"\n"].concat();
    let mut len = body.len() + 1;
    while format!("{len} ").len() + body.len() != len {
        len = format!("{len} ").len() + body.len();
    }
    [format!("{len} ").into_bytes(), body].concat()
}

/// A gzip stream of a tar holding one file of `size` zero bytes, made without holding it.
fn zero_bomb(size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_path("bomb").unwrap();
    h.set_entry_type(EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(h.as_bytes()).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        gz.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap()
}

fn small_limits() -> Limits {
    Limits {
        max_entries: 100,
        max_file_bytes: 1 << 20,
        max_unpacked_bytes: 4 << 20,
        ..Limits::default()
    }
}

fn cases() -> Vec<Case> {
    let d = Limits::default;
    vec![
        Case {
            name: "traversal ../",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .file("ok", b"ok")
                        .file("../../escaped", b"x")
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Refused(&["escaped", "climbs above the root"]),
        },
        Case {
            name: "traversal inside a path",
            image: |_| tar_layer(Tar::new().file("a/../../escaped", b"x").bytes()),
            limits: d(),
            expect: Expect::Refused(&["climbs above the root"]),
        },
        Case {
            name: "absolute path",
            image: |o| tar_layer(Tar::new().file(&out(o, "abs"), b"inside").bytes()),
            limits: d(),
            expect: Expect::Pulled(|root, o| {
                let inside = root.join(o.join("abs").strip_prefix("/").unwrap());
                assert_eq!(fs::read(inside).unwrap(), b"inside");
            }),
        },
        Case {
            name: "symlink escape then write through it",
            image: |o| {
                tar_layer(
                    Tar::new()
                        .symlink("link", o.to_str().unwrap())
                        .file("link/escaped", b"x")
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Refused(&["link/escaped"]),
        },
        Case {
            name: "climbing relative symlink then write through it",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .symlink("up", "../../../../../../..")
                        .file("up/climbed", b"x")
                        .bytes(),
                )
            },
            limits: d(),
            // Resolved in the root: `..` stops at `/`, the file lands at the image's top.
            expect: Expect::Pulled(|root, _| {
                assert_eq!(fs::read(root.join("climbed")).unwrap(), b"x");
            }),
        },
        Case {
            name: "symlink planted by a lower layer, written through by an upper one",
            image: |o| {
                two_layers(
                    Tar::new().symlink("etc", o.to_str().unwrap()).bytes(),
                    Tar::new().file("etc/passwd", b"root::0:0").bytes(),
                )
            },
            limits: d(),
            expect: Expect::Pulled(|root, _| {
                assert!(fs::symlink_metadata(root.join("etc")).unwrap().is_dir());
                assert_eq!(fs::read(root.join("etc/passwd")).unwrap(), b"root::0:0");
            }),
        },
        Case {
            name: "hardlink to outside by ..",
            image: |_| tar_layer(Tar::new().hardlink("h", "../../../../secret").bytes()),
            limits: d(),
            expect: Expect::Refused(&["hard link target", "climbs"]),
        },
        Case {
            name: "hardlink to an absolute host path",
            image: |o| tar_layer(Tar::new().hardlink("h", &out(o, "secret")).bytes()),
            limits: d(),
            expect: Expect::Refused(&["hard link"]),
        },
        Case {
            name: "hardlink through a symlink to outside",
            image: |o| {
                tar_layer(
                    Tar::new()
                        .symlink("s", o.to_str().unwrap())
                        .hardlink("h", "s/secret")
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Refused(&["hard link"]),
        },
        Case {
            name: "hardlink to a symlink",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .symlink("s", "/etc/shadow")
                        .hardlink("h", "s")
                        .bytes(),
                )
            },
            limits: d(),
            // The link is to the symlink itself, never followed: one more symlink, which
            // resolves inside the job's root.
            expect: Expect::Pulled(|root, _| {
                assert!(fs::symlink_metadata(root.join("h"))
                    .unwrap()
                    .file_type()
                    .is_symlink());
                assert_eq!(
                    fs::read_link(root.join("h")).unwrap(),
                    Path::new("/etc/shadow")
                );
            }),
        },
        Case {
            name: "hardlink to a directory",
            image: |_| tar_layer(Tar::new().dir("d/").hardlink("h", "d").bytes()),
            limits: d(),
            expect: Expect::Refused(&["hard link"]),
        },
        Case {
            name: "character and block devices",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .raw(EntryType::Char, b"dev/mem", b"", b"", 0o666)
                        .raw(EntryType::Block, b"dev/sda", b"", b"", 0o660)
                        .file("kept", b"k")
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Pulled(|root, _| {
                assert!(fs::symlink_metadata(root.join("dev/mem")).is_err());
                assert!(fs::symlink_metadata(root.join("dev/sda")).is_err());
                assert!(root.join("kept").is_file());
            }),
        },
        Case {
            name: "a FIFO",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .raw(EntryType::Fifo, b"run/fifo", b"", b"", 0o644)
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Pulled(|root, _| {
                assert!(fs::symlink_metadata(root.join("run/fifo")).is_err());
            }),
        },
        Case {
            name: "etc/passwd as a FIFO",
            image: |_| {
                two_layers(
                    Tar::new()
                        .dir("etc")
                        .file("etc/passwd", b"root:x:0:0")
                        .bytes(),
                    Tar::new()
                        .raw(EntryType::Fifo, b"etc/passwd", b"", b"", 0o644)
                        .bytes(),
                )
            },
            limits: d(),
            // Skipped: the lower layer's regular file stays, and nothing waits on a FIFO.
            expect: Expect::Pulled(|root, _| {
                let m = fs::symlink_metadata(root.join("etc/passwd")).unwrap();
                assert!(m.is_file());
            }),
        },
        Case {
            name: "setuid and setgid bits",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .raw(EntryType::Regular, b"bin/suid", b"", b"#!/bin/sh\n", 0o6755)
                        .bytes(),
                )
            },
            limits: d(),
            // Kept as the image says (jobs run without privileges: the bits give nothing),
            // behind the store's private directories.
            expect: Expect::Pulled(|root, _| {
                let mode = fs::metadata(root.join("bin/suid"))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o7777, 0o6755);
            }),
        },
        Case {
            name: "file over the per-file limit",
            image: |_| tar_layer(Tar::new().file("big", &vec![1u8; (1 << 20) + 1]).bytes()),
            limits: small_limits(),
            expect: Expect::Refused(&["big", "per file"]),
        },
        Case {
            name: "huge sparse file declared over the per-file limit",
            image: |_| {
                // One byte of data at the end of a 1 GiB hole.
                let octal = |v: u64| {
                    let mut f = [0u8; 12];
                    f[..11].copy_from_slice(format!("{v:011o}").as_bytes());
                    f
                };
                let mut h = tar::Header::new_gnu();
                h.set_path("sparse").unwrap();
                h.set_entry_type(EntryType::GNUSparse);
                h.set_size(1);
                h.set_mode(0o644);
                h.set_uid(0);
                h.set_gid(0);
                h.set_mtime(1_700_000_000);
                let gnu = h.as_gnu_mut().unwrap();
                gnu.set_real_size(1 << 30);
                gnu.sparse[0].offset = octal((1 << 30) - 1);
                gnu.sparse[0].numbytes = octal(1);
                h.set_cksum();
                let mut tar = h.as_bytes().to_vec();
                tar.extend_from_slice(&[7u8]);
                tar.resize(1024, 0);
                tar.extend_from_slice(&[0u8; 1024]);
                tar_layer(tar)
            },
            limits: small_limits(),
            expect: Expect::Refused(&["sparse", "per file"]),
        },
        Case {
            name: "total size bomb",
            image: |_| {
                let mut t = Tar::new();
                for i in 0..5 {
                    t.file(&format!("f{i}"), &vec![2u8; 1 << 20]);
                }
                gz_layer(t.bytes())
            },
            limits: small_limits(),
            expect: Expect::Refused(&["per image"]),
        },
        Case {
            name: "gzip bomb",
            image: |_| Image::Layers(vec![(LAYER_GZIP, zero_bomb(256 << 20))], None),
            limits: Limits {
                max_unpacked_bytes: 16 << 20,
                ..d()
            },
            expect: Expect::Refused(&["per image"]),
        },
        Case {
            name: "too many entries",
            image: |_| {
                let mut t = Tar::new();
                for i in 0..200 {
                    t.file(&format!("e{i}"), b"");
                }
                tar_layer(t.bytes())
            },
            limits: small_limits(),
            expect: Expect::Refused(&["entries"]),
        },
        Case {
            name: "truncated gzip",
            image: |_| {
                let gz = gzip(&Tar::new().file("f", &vec![3u8; 100_000]).bytes());
                let cut = gz[..gz.len() / 2].to_vec();
                let diff = sha256(&Tar::new().file("f", &vec![3u8; 100_000]).bytes());
                Image::Layers(vec![(LAYER_GZIP, cut)], Some(vec![diff]))
            },
            limits: d(),
            expect: Expect::Refused(&["layer 1", "incomplete deflate stream"]),
        },
        Case {
            name: "bytes after the gzip stream",
            image: |_| {
                let tar = Tar::new().file("f", b"data").bytes();
                let mut gz = gzip(&tar);
                gz.extend_from_slice(b"trailing garbage");
                Image::Layers(vec![(LAYER_GZIP, gz)], Some(vec![sha256(&tar)]))
            },
            limits: d(),
            expect: Expect::Refused(&["corrupt at its end"]),
        },
        Case {
            name: "gzip with a bad CRC",
            image: |_| {
                let tar = Tar::new().file("f", &[5u8; 4096]).bytes();
                let mut gz = gzip(&tar);
                let at = gz.len() - 8;
                gz[at] ^= 1;
                Image::Layers(vec![(LAYER_GZIP, gz)], Some(vec![sha256(&tar)]))
            },
            limits: d(),
            expect: Expect::Refused(&["corrupt"]),
        },
        Case {
            name: "malformed tar header",
            image: |_| {
                let mut tar = vec![b'A'; 512];
                tar.extend_from_slice(&[0u8; 1024]);
                tar_layer(tar)
            },
            limits: d(),
            expect: Expect::Refused(&["reading the archive", "cksum"]),
        },
        Case {
            name: "tar header with a bad checksum",
            image: |_| {
                let mut tar = Tar::new().file("f", b"x").bytes();
                tar[0] ^= 0x20;
                tar_layer(tar)
            },
            limits: d(),
            expect: Expect::Refused(&["checksum"]),
        },
        Case {
            name: "PAX path override climbing out",
            image: |_| {
                let pax = pax_record("path", b"../../../escaped");
                let mut t = Tar::new();
                t.raw(EntryType::XHeader, b"pax", b"", &pax, 0o644)
                    .file("innocent", b"x");
                tar_layer(t.bytes())
            },
            limits: d(),
            expect: Expect::Refused(&["escaped", "climbs above the root"]),
        },
        Case {
            name: "PAX linkpath override to outside",
            image: |o| {
                let pax = pax_record("linkpath", out(o, "secret").as_bytes());
                let mut t = Tar::new();
                t.raw(EntryType::XHeader, b"pax", b"", &pax, 0o644)
                    .hardlink("h", "innocent");
                tar_layer(t.bytes())
            },
            limits: d(),
            expect: Expect::Refused(&["hard link"]),
        },
        Case {
            name: "GNU long name climbing out",
            image: |_| {
                let long = format!("{}/../../../../../../escaped\0", "d".repeat(120));
                let long = long.replacen(&"d".repeat(120), &"../".repeat(40), 1);
                let mut t = Tar::new();
                t.raw(
                    EntryType::GNULongName,
                    b"././@LongLink",
                    b"",
                    long.as_bytes(),
                    0o644,
                )
                .file("innocent", b"x");
                tar_layer(t.bytes())
            },
            limits: d(),
            expect: Expect::Refused(&["climbs above the root"]),
        },
        Case {
            name: "duplicate entries",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .file("dup", b"first")
                        .symlink("dup", "/etc/shadow")
                        .file("dup", b"second")
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Pulled(|root, _| {
                assert!(fs::symlink_metadata(root.join("dup")).unwrap().is_file());
                assert_eq!(fs::read(root.join("dup")).unwrap(), b"second");
            }),
        },
        Case {
            name: "whiteout of ..",
            image: |_| {
                two_layers(
                    Tar::new().file("keep", b"k").bytes(),
                    Tar::new().file(".wh..", b"").file("d/.wh..", b"").bytes(),
                )
            },
            limits: d(),
            expect: Expect::Pulled(|root, _| {
                assert!(root.join("keep").is_file());
                assert!(find_named(root, ".wh..").is_empty());
            }),
        },
        Case {
            name: "whiteout climbing out",
            image: |_| tar_layer(Tar::new().file("../.wh.outside", b"").bytes()),
            limits: d(),
            expect: Expect::Refused(&["climbs above the root"]),
        },
        Case {
            name: "opaque whiteout at the root",
            image: |_| {
                two_layers(
                    Tar::new()
                        .dir("old")
                        .file("old/f", b"o")
                        .file("top", b"t")
                        .bytes(),
                    Tar::new()
                        .file(".wh..wh..opq", b"")
                        .file("new", b"n")
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Pulled(|root, _| {
                assert!(!root.join("old").exists() && !root.join("top").exists());
                assert_eq!(fs::read(root.join("new")).unwrap(), b"n");
            }),
        },
        Case {
            name: "very deep directories",
            image: |_| {
                let deep = "d/".repeat(300) + "f";
                let mut t = Tar::new();
                let pax = pax_record("path", deep.as_bytes());
                t.raw(EntryType::XHeader, b"pax", b"", &pax, 0o644)
                    .file("f", b"x");
                tar_layer(t.bytes())
            },
            limits: d(),
            expect: Expect::Refused(&["deeper"]),
        },
        Case {
            name: "very long path",
            image: |_| {
                let long = format!("{}/f", "n".repeat(250)).repeat(20);
                let mut t = Tar::new();
                let pax = pax_record("path", long.as_bytes());
                t.raw(EntryType::XHeader, b"pax", b"", &pax, 0o644)
                    .file("f", b"x");
                tar_layer(t.bytes())
            },
            limits: d(),
            expect: Expect::Refused(&["longer than"]),
        },
        Case {
            name: "a name longer than the filesystem allows",
            image: |_| {
                let mut t = Tar::new();
                let pax = pax_record("path", "n".repeat(300).as_bytes());
                t.raw(EntryType::XHeader, b"pax", b"", &pax, 0o644)
                    .file("f", b"x");
                tar_layer(t.bytes())
            },
            limits: d(),
            expect: Expect::Refused(&["component is longer than 255 bytes"]),
        },
        Case {
            name: "symlink loop written through",
            image: |_| {
                tar_layer(
                    Tar::new()
                        .symlink("a", "b")
                        .symlink("b", "a")
                        .file("a/x", b"x")
                        .bytes(),
                )
            },
            limits: d(),
            expect: Expect::Refused(&["a/x"]),
        },
        Case {
            name: "the root named by a file",
            image: |_| tar_layer(Tar::new().file("./", b"").file(".", b"x").bytes()),
            limits: d(),
            expect: Expect::Refused(&["names the root"]),
        },
        Case {
            name: "diff_id mismatch",
            image: |_| {
                Image::Layers(
                    vec![(LAYER_GZIP, gzip(&Tar::new().file("f", b"x").bytes()))],
                    Some(vec![sha256(b"something else")]),
                )
            },
            limits: d(),
            expect: Expect::Refused(&["diff_id", "tampered"]),
        },
        Case {
            name: "blob digest mismatch",
            image: |_| {
                let good = gzip(&Tar::new().file("f", b"good").bytes());
                let evil = gzip(&Tar::new().file("f", b"evil").bytes());
                Image::Raw {
                    descs: vec![descriptor(LAYER_GZIP, &good)],
                    blobs: vec![(sha256(&good), evil)],
                    diff_ids: vec![sha256(&Tar::new().file("f", b"good").bytes())],
                }
            },
            limits: d(),
            expect: Expect::Refused(&["does not match its digest"]),
        },
        Case {
            name: "blob shorter than its descriptor",
            image: |_| {
                let tar = Tar::new().file("f", b"short").bytes();
                let gz = gzip(&tar);
                let mut desc = descriptor(LAYER_GZIP, &gz);
                desc["size"] = (gz.len() + 1000).into();
                Image::Raw {
                    blobs: vec![(sha256(&gz), gz)],
                    descs: vec![desc],
                    diff_ids: vec![sha256(&tar)],
                }
            },
            limits: d(),
            expect: Expect::Refused(&["does not match its digest"]),
        },
        Case {
            name: "layer of an unsupported compression",
            image: |_| {
                Image::Layers(
                    vec![("application/vnd.oci.image.layer.v1.tar+xz", b"x".to_vec())],
                    None,
                )
            },
            limits: d(),
            expect: Expect::Refused(&["tar+xz"]),
        },
        Case {
            name: "more layers than diff_ids",
            image: |_| {
                let tar = Tar::new().file("f", b"x").bytes();
                Image::Layers(
                    vec![(LAYER_TAR, tar.clone()), (LAYER_TAR, tar.clone())],
                    Some(vec![sha256(&tar)]),
                )
            },
            limits: d(),
            expect: Expect::Refused(&["diff_ids"]),
        },
    ]
}

/// Serves case `i` as `hostile/c<i>:v1`.
fn serve(reg: &Served, i: usize, image: Image) {
    let repo = format!("hostile/c{i}");
    match image {
        Image::Layers(layers, diff_ids) => {
            reg.image_with(
                &repo,
                "v1",
                &layers,
                diff_ids.as_deref(),
                serde_json::json!({}),
            );
        }
        Image::Raw {
            descs,
            blobs,
            diff_ids,
        } => {
            for (digest, data) in blobs {
                reg.put(&format!("{repo}/blobs/{digest}"), "", data);
            }
            let config = config_json(&diff_ids, serde_json::json!({}));
            let config_desc = reg.blob(&repo, CONFIG, &config);
            reg.manifest(&repo, "v1", manifest_json(config_desc, descs));
        }
    }
}

/// Pulls `r` into `store` on a thread, failing the test past [`TIME_LIMIT`].
fn pull_within(
    store: &wharf_images::ImageStore,
    r: wharf_images::ImageRef,
    name: &str,
) -> Result<ImageInfo, wharf_images::ImageError> {
    let (tx, rx) = mpsc::channel();
    let store = store.clone();
    std::thread::spawn(move || {
        let _ = tx.send(store.pull(&r, &RegistryOptions::default(), &mut |_| {}));
    });
    rx.recv_timeout(TIME_LIMIT)
        .unwrap_or_else(|_| panic!("{name}: the pull did not end within {TIME_LIMIT:?}"))
}

fn entries(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn hostile_pulls_write_nothing_outside_are_named_and_leave_nothing() {
    let cases = cases();
    assert!(cases.len() >= 30, "{} cases", cases.len());
    let names: std::collections::BTreeSet<_> = cases.iter().map(|c| c.name).collect();
    assert_eq!(names.len(), cases.len(), "case names are distinct");
    let reg = Served::start();
    for (i, case) in cases.iter().enumerate() {
        let s = scratch_with(case.limits);
        fs::write(s.base.join("secret"), b"secret").unwrap();
        let secret = s.outside.join("secret");
        fs::write(&secret, b"secret").unwrap();
        serve(&reg, i, (case.image)(&s.outside));
        let r = reg.reference(&format!("hostile/c{i}:v1"));
        let res = pull_within(&s.store, r, case.name);
        let name = case.name;
        match (&case.expect, res) {
            (Expect::Refused(words), Err(e)) => {
                assert_eq!(e.kind, ErrorKind::InvalidInput, "{name}: {e}");
                for w in *words {
                    assert!(e.message.contains(w), "{name}: {w:?} not in: {e}");
                }
                eprintln!("refused: {name}: {e}");
                assert!(s.store.list().unwrap().is_empty(), "{name}");
                assert!(entries(&s.store.root().join("roots")).is_empty(), "{name}");
                // A refused single-layer image keeps no layer; a two-layer one at most its
                // good lower layer.
                assert!(
                    entries(&s.store.root().join("layers")).len() <= 1,
                    "{name}: {:?}",
                    entries(&s.store.root().join("layers"))
                );
            }
            (Expect::Pulled(check), Ok(info)) => check(&info.rootfs, &s.outside),
            (Expect::Refused(_), Ok(info)) => panic!("{name}: pulled: {info:?}"),
            (Expect::Pulled(_), Err(e)) => panic!("{name}: refused: {e}"),
        }
        // Nothing outside but the planted secret, unlinked to anything.
        assert_eq!(entries(&s.outside), ["secret"], "{name}");
        assert_eq!(fs::metadata(&secret).unwrap().nlink(), 1, "{name}");
        assert_eq!(fs::read(&secret).unwrap(), b"secret", "{name}");
        assert_eq!(
            fs::metadata(s.base.join("secret")).unwrap().nlink(),
            1,
            "{name}"
        );
        let mut top = entries(&s.base);
        top.sort();
        assert_eq!(top, ["outside", "secret", "store", "work"], "{name}");
        s.assert_no_leftovers();
        let locks: Vec<String> = entries(&s.store.root().join("locks"))
            .into_iter()
            .filter(|l| l != "cache.lock")
            .collect();
        assert!(locks.is_empty(), "{name}: lock files left: {locks:?}");
        eprintln!("ok: {name}");
    }
}
