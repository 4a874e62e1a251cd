//! The runtime conformance suite against the real OCI backend (the `wharf shim`), as root.
//! The fake backend runs the same suite in `runtime/tests/conformance_fake.rs`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use wharf_runtime::conformance::{run, template, Suite};
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
    run(&backend, &suite);
}
