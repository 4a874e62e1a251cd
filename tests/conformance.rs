//! The runtime conformance suite against the real OCI backend (the `wharf shim`), as root.
//! The fake backend runs the same suite in `runtime/tests/conformance_fake.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use wharf_runtime::conformance::{run as run_suite, template, Suite};
use wharf_runtime::Launcher;

#[test]
fn oci_backend_passes_the_conformance_suite() {
    if !nix::unistd::geteuid().is_root() {
        let why = "oci_backend_passes_the_conformance_suite: needs root";
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("wharf-conformance-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let rootfs = dir.path().join("rootfs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mkrootfs.sh");
    let ok = std::process::Command::new(script)
        .arg(&rootfs)
        .args(["sh", "true", "false", "sleep"])
        .status()
        .unwrap();
    assert!(ok.success());
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    let suite = Suite {
        dir: dir.path().to_path_buf(),
        template: template("oci", &rootfs, 4243, 4243),
    };
    run_suite(&backend, &suite);
}

#[test]
fn sif_images_pass_the_conformance_suite() {
    let have = |t: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !nix::unistd::geteuid().is_root() || !have("siftool") || !have("mksquashfs") {
        let why = "sif_images_pass_the_conformance_suite: needs root, siftool and mksquashfs";
        assert!(
            std::env::var("WHARF_TEST_STRICT").as_deref() != Ok("1"),
            "{why}"
        );
        eprintln!("SKIPPED {why}");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("wharf-conformance-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let rootfs = dir.path().join("rootfs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mkrootfs.sh");
    assert!(std::process::Command::new(script)
        .arg(&rootfs)
        .args(["sh", "true", "false", "sleep"])
        .status()
        .unwrap()
        .success());
    let (sqfs, sif) = (dir.path().join("root.sqfs"), dir.path().join("root.sif"));
    let run = |args: &[&str]| {
        assert!(
            std::process::Command::new(args[0])
                .args(&args[1..])
                .output()
                .unwrap()
                .status
                .success(),
            "{args:?}"
        )
    };
    run(&[
        "mksquashfs",
        rootfs.to_str().unwrap(),
        sqfs.to_str().unwrap(),
        "-noappend",
        "-quiet",
        "-all-root",
    ]);
    run(&["siftool", "new", sif.to_str().unwrap()]);
    run(&[
        "siftool",
        "add",
        sif.to_str().unwrap(),
        sqfs.to_str().unwrap(),
        "--datatype",
        "4",
        "--parttype",
        "2",
        "--partfs",
        "1",
        "--partarch",
        "2",
    ]);
    let part = wharf_images::sif::primary_partition(&sif).unwrap();
    let mut template = template("sif", &sif, 4244, 4244);
    template.rootfs_partition = Some((part.offset, part.size));
    let backend = Launcher::new(PathBuf::from(env!("CARGO_BIN_EXE_wharf")));
    run_suite(
        &backend,
        &Suite {
            dir: dir.path().to_path_buf(),
            template,
        },
    );
}
