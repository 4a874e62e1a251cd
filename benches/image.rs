//! Registry pulls: cold pull + unpack of one multi-layer image from a loopback registry by
//! `wharf image pull`, next to `skopeo copy` + `umoci unpack` of the same image in the same
//! run, and the warm start (the cached image found and mounted as a job's overlay root).
//!
//! The image (`WHARF_BENCH_IMAGE_MB`, 200 MB of files by default, in 4 gzip layers of many small
//! files and a few large ones, half of each file random and half text so it compresses as real
//! images do) is written as an OCI layout, pushed by `skopeo` to Debian's `docker-registry`
//! started on a free loopback port, then pulled `WHARF_BENCH_RUNS` (3) times by each tool into
//! a fresh directory; medians are reported. Needs root (the warm start mounts an overlay) and
//! `docker-registry`, `skopeo` and `umoci` (`apt-get install docker-registry skopeo umoci`).
//!
//! `WHARF_BENCH_BIN` names a prebuilt `wharf` binary to pull with (another build's, to compare
//! two in the same conditions).
//!
//! `cargo bench --bench image`; the last line is
//! `RESULT image cold_ms=... skopeo_umoci_ms=... ratio=...` (ratio > 1: Wharf is faster).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use sha2::{Digest, Sha256};

// The loopback registry the image crate's registry tests and the e2e tests also start.
#[path = "../images/tests/common/loopback.rs"]
mod loopback;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic byte source (xorshift64*).
struct Rng(u64);

impl Rng {
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let v = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// One layer's tar: `small` files of 1–32 KiB under `layer<n>/`, and two large ones.
fn layer_tar(n: usize, bytes: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::with_capacity(bytes + bytes / 8));
    let mut left = bytes;
    let large = bytes / 4;
    let text = b"the quick brown fox jumps over the lazy dog; ".repeat(1024);
    let file = |b: &mut tar::Builder<Vec<u8>>, name: String, size: usize, rng: &mut Rng| {
        let mut data = vec![0u8; size];
        rng.fill(&mut data[..size / 2]);
        for (i, d) in data[size / 2..].iter_mut().enumerate() {
            *d = text[i % text.len()];
        }
        let mut h = tar::Header::new_gnu();
        h.set_size(size as u64);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, &data[..]).unwrap();
    };
    for i in 0..2 {
        file(&mut b, format!("layer{n}/large{i}.bin"), large, rng);
        left -= large;
    }
    let mut i = 0;
    while left > 0 {
        let mut r = [0u8; 2];
        rng.fill(&mut r);
        let size = (1024 + (u16::from_le_bytes(r) as usize % 31) * 1024).min(left);
        file(&mut b, format!("layer{n}/d{}/f{i}", i / 200), size, rng);
        left -= size;
        i += 1;
    }
    b.into_inner().unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Writes the OCI layout of an image of `mb` MB in `layers` gzip layers, tagged `bench`.
fn write_layout(dir: &Path, mb: usize, layers: usize) {
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = sha256(bytes);
        fs::write(blobs.join(d.trim_start_matches("sha256:")), bytes).unwrap();
        (d, bytes.len())
    };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut descs, mut diff_ids) = (vec![], vec![]);
    for n in 0..layers {
        let tar = layer_tar(n, (mb << 20) / layers, &mut rng);
        diff_ids.push(sha256(&tar));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        let (d, s) = put(&gz.finish().unwrap());
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": s
        }));
    }
    let config = serde_json::json!({
        "architecture": if cfg!(target_arch = "aarch64") { "arm64" } else { "amd64" },
        "os": "linux", "rootfs": { "type": "layers", "diff_ids": diff_ids },
    });
    let (cd, cs) = put(&serde_json::to_vec(&config).unwrap());
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs },
        "layers": descs,
    });
    let (md, ms) = put(&serde_json::to_vec(&manifest).unwrap());
    let index = serde_json::json!({ "schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
        "annotations": { "org.opencontainers.image.ref.name": "bench" } }] });
    fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
}

/// Marks `dir` as the top of directory hierarchies (ext4's `chattr +T`), so each run's output
/// directory, of either tool, starts in a block group of its own. Without it, both tools
/// allocate next to what the previous run deleted, and on ext4 without a journal each new
/// inode then costs a scan of every inode freed in the last minutes: whichever tool ran first
/// after a delete paid for it, and the other's time moved with where the first one's files
/// went. Other filesystems refuse the flag, which is ignored.
fn spread_subdirs(dir: &Path) {
    use std::os::fd::AsRawFd;
    const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;
    let dir = fs::File::open(dir).unwrap();
    let mut flags: libc::c_int = 0;
    // SAFETY: both requests read or write one int through the pointer, which outlives them.
    unsafe {
        if libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) == 0 {
            flags |= FS_TOPDIR_FL;
            libc::ioctl(dir.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags);
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The `wharf` binary under test: `WHARF_BENCH_BIN`, else the one built with the benchmark.
fn wharf_bin() -> PathBuf {
    std::env::var_os("WHARF_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_wharf").into())
}

/// Finds the cached image and mounts it as a job's root is mounted (an overlay of the image
/// under a tmpfs layer), then unmounts; returns the milliseconds to mounted.
fn warm_start(store: &Path, reference: &str, scratch: &Path) -> f64 {
    use nix::mount::{mount, umount, MsFlags};
    let layer = scratch.join("layer");
    let target = scratch.join("root");
    fs::create_dir_all(&layer).unwrap();
    fs::create_dir_all(&target).unwrap();
    let t = Instant::now();
    let store = wharf_images::ImageStore::open(store.to_path_buf()).unwrap();
    let r: wharf_images::ImageRef = reference.parse().unwrap();
    let info = store.pulled(&r).expect("the image is cached");
    mount(
        Some("tmpfs"),
        &layer,
        Some("tmpfs"),
        MsFlags::empty(),
        Some("size=16m"),
    )
    .unwrap();
    fs::create_dir_all(layer.join("upper")).unwrap();
    fs::create_dir_all(layer.join("work")).unwrap();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        info.rootfs.display(),
        layer.join("upper").display(),
        layer.join("work").display()
    );
    mount(
        Some("overlay"),
        &target,
        Some("overlay"),
        MsFlags::empty(),
        Some(opts.as_str()),
    )
    .unwrap();
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    assert!(target.join("layer0/large0.bin").is_file());
    umount(&target).unwrap();
    umount(&layer).unwrap();
    ms
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let missing = loopback::missing(&["docker-registry", "skopeo", "umoci"]);
    if !missing.is_empty() || !nix::unistd::geteuid().is_root() {
        println!(
            "SKIPPED image benchmark: needs root and docker-registry, skopeo, umoci (missing: {})",
            missing.join(" ")
        );
        return;
    }
    let mb: usize = env_or("WHARF_BENCH_IMAGE_MB", 200);
    let runs: usize = env_or("WHARF_BENCH_RUNS", 3);
    let dir = tempfile::Builder::new()
        .prefix("wharf-bench-image-")
        .tempdir_in("/var/tmp")
        .unwrap();
    spread_subdirs(dir.path());
    let layout = dir.path().join("layout");
    let t = Instant::now();
    write_layout(&layout, mb, 4);
    // The layout's blobs are in the registry once pushed; the layout itself is not needed.
    println!(
        "image: {mb} MB in 4 gzip layers, written in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let registry = loopback::Loopback::start_in(dir.path(), false);
    registry.push(&layout, "bench", "bench/image", None);
    let reference = registry.name("bench/image:bench");
    let _ = fs::remove_dir_all(&layout);

    let (mut wharf, mut skopeo) = (vec![], vec![]);
    for i in 0..runs {
        let store = dir.path().join(format!("store{i}"));
        let t = Instant::now();
        run(Command::new(wharf_bin())
            .args(["image", "pull", &reference, "--store"])
            .arg(&store));
        wharf.push(t.elapsed().as_secs_f64() * 1000.0);

        let oci = dir.path().join(format!("skopeo{i}"));
        let bundle = dir.path().join(format!("bundle{i}"));
        let t = Instant::now();
        run(Command::new("skopeo")
            .args(["copy", "--quiet", "--src-tls-verify=false"])
            .arg(format!("docker://{reference}"))
            .arg(format!("oci:{}:bench", oci.display())));
        run(Command::new("umoci")
            .args(["unpack", "--image"])
            .arg(format!("{}:bench", oci.display()))
            .arg(&bundle));
        skopeo.push(t.elapsed().as_secs_f64() * 1000.0);
        println!(
            "run {}: wharf {:.0} ms, skopeo+umoci {:.0} ms",
            i + 1,
            wharf[i],
            skopeo[i]
        );
        // Disk is kept small: each run's output goes, but the last store (for the warm start).
        let _ = fs::remove_dir_all(&oci);
        let _ = fs::remove_dir_all(&bundle);
        if i + 1 < runs {
            let _ = fs::remove_dir_all(&store);
        }
    }
    let store = dir.path().join(format!("store{}", runs - 1));
    let warm: Vec<f64> = (0..20)
        .map(|i| warm_start(&store, &reference, &dir.path().join(format!("warm{i}"))))
        .collect();
    let (cold, anchor, warm) = (median(wharf), median(skopeo), median(warm));
    println!("warm start (cached image to mounted overlay root), median of 20: {warm:.2} ms");
    println!(
        "RESULT image cold_ms={cold:.0} skopeo_umoci_ms={anchor:.0} ratio={:.2}",
        anchor / cold
    );
}
