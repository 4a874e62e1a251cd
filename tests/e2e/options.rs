//! Per-job sandbox options: user binds within the admin's allow list, and root inside (the
//! user outside).

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use crate::harness::*;

fn shared_dir() -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("wharf-allowed-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

#[test]
fn user_binds_only_under_allowed_paths_and_only_where_the_user_can_reach() {
    if !can_run("user_binds_only_under_allowed_paths_and_only_where_the_user_can_reach") {
        return;
    }
    let shared = shared_dir();
    let c = Cluster::start_with(&format!(
        "allowed_mounts = [\"{}\"]",
        shared.path().display()
    ));
    c.import_tiny();
    let (alice, bob) = (user("wharf-alice"), user("wharf-bob"));
    let data = shared.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("in.txt"), "shared input\n").unwrap();
    std::os::unix::fs::symlink("/etc", shared.path().join("sneaky")).unwrap();
    let private = shared.path().join("bob-private");
    std::fs::create_dir_all(private.join("inner")).unwrap();
    nix::unistd::chown(&private, Some(bob.uid.into()), Some(bob.gid.into())).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();

    let bind = format!("{}:/input:ro", data.display());
    let out = c.wharf_as(
        &alice,
        &[
            "run",
            "--image",
            "tiny",
            "--mount",
            &bind,
            "--",
            "/bin/sh",
            "-c",
            "cat /input/in.txt; (echo x > /input/y) 2>/dev/null || echo ro",
        ],
    );
    assert_eq!(stdout(&out), "shared input\nro\n", "{}", stderr(&out));

    let cases = [
        (
            "/etc:/x".to_string(),
            "is not under a path this node allows",
        ),
        (
            format!("{}:/x", shared.path().join("sneaky").display()),
            "/etc is not under a path this node allows",
        ),
        (
            format!("{}:/x", private.join("inner").display()),
            "you cannot reach",
        ),
    ];
    for (bind, expect) in cases {
        let out = c.wharf_as(
            &alice,
            &[
                "run",
                "--image",
                "tiny",
                "--mount",
                &bind,
                "--",
                "/bin/true",
            ],
        );
        assert_ne!(out.status.code(), Some(0), "{bind} was allowed");
        assert!(
            stderr(&out).contains(expect),
            "{bind}: {expect:?} not in {}",
            stderr(&out)
        );
    }
    // A malformed bind is refused at submit, and nothing is stored.
    let out = c.wharf_as(
        &alice,
        &["submit", "--mount", "relative:/x", "--wrap", "true"],
    );
    assert!(
        stderr(&out).contains("is not SOURCE:DEST"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn remapped_root_is_root_inside_and_the_user_outside() {
    if !can_run("remapped_root_is_root_inside_and_the_user_outside") {
        return;
    }
    let shared = shared_dir();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let c = Cluster::start_with(&format!("mounts = [\"{}\"]", shared.path().display()));
    c.import_tiny();
    let alice = user("wharf-alice");
    let file = shared.path().join("made-as-root");
    let script = format!(
        "id -u; id -g; grep CapEff /proc/self/status; touch {}",
        file.display()
    );
    let out = c.wharf_as(
        &alice,
        &[
            "run",
            "--image",
            "tiny",
            "--remap-root",
            "--",
            "/bin/sh",
            "-c",
            &script,
        ],
    );
    assert_eq!(
        stdout(&out),
        "0\n0\nCapEff:\t0000000000000000\n",
        "{}",
        stderr(&out)
    );
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (alice.uid, alice.gid),
        "root inside is the user outside"
    );
}
