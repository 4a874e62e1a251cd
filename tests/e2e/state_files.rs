//! The controller's database and the agent's job directories hold every job's command and
//! environment: no other user may read them, whatever the umask the daemons start under.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::harness::*;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// `cat FILE` as `user`: true when it printed anything.
fn readable_by(user: &User, c: &Cluster, file: &Path) -> bool {
    let out = as_user(
        user,
        &c.dir,
        "/bin/cat",
        &[file.to_str().unwrap()],
        &c.socket,
    );
    out.status.success()
}

#[test]
fn another_user_cannot_read_the_database_or_a_job_spec() {
    if !can_run("another_user_cannot_read_the_database_or_a_job_spec") {
        return;
    }
    // The daemons inherit this: the modes must not depend on it.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let mut c = Cluster::start();
    let (owner, other) = (user("whctl-owner"), user("whctl-snoop"));
    let id = submitted_id(&c.wharf_as(
        &owner,
        &[
            "submit",
            "--env",
            "API_KEY=whctl-secret-key",
            "--wrap",
            "sleep 60",
        ],
    ));
    c.wait_running(id);

    let state = c.dir.join("controller");
    let db = state.join("wharf.db");
    for f in ["wharf.db", "wharf.db-wal", "wharf.db-shm"] {
        assert!(
            !readable_by(&other, &c, &state.join(f)),
            "another user read {f}"
        );
    }
    assert_eq!(mode(&state), 0o700, "controller state dir");
    for f in ["wharf.db", "wharf.db-wal", "wharf.db-shm"] {
        let p = state.join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{f}");
        }
    }
    assert!(
        std::fs::read(&db).is_ok() && std::fs::read(state.join("wharf.db-wal")).is_ok(),
        "root reads the database"
    );
    let list = as_user(
        &other,
        &c.dir,
        "/bin/ls",
        &[state.to_str().unwrap()],
        &c.socket,
    );
    assert!(!list.status.success(), "another user listed the state dir");

    let jobs = c.dir.join("agent/jobs");
    let spec = jobs.join(id.to_string()).join("spec.json");
    let text = std::fs::read_to_string(&spec).unwrap();
    assert!(text.contains("whctl-secret-key"), "the spec holds the env");
    assert!(
        !readable_by(&other, &c, &spec),
        "another user read the job spec"
    );
    let list = as_user(
        &other,
        &c.dir,
        "/bin/ls",
        &[jobs.to_str().unwrap()],
        &c.socket,
    );
    assert!(
        !list.status.success(),
        "another user listed the job directories"
    );
    assert_eq!(mode(&c.dir.join("agent")), 0o711);
    assert_eq!(mode(&jobs), 0o711);

    // The socket stays reachable by every user.
    let out = c.wharf_as(&other, &["queue"]);
    assert!(out.status.success(), "{}", stderr(&out));

    // An install made by an older version (0755 directory, 0644 files) is corrected at start.
    c.kill9();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(c.dir.join("agent"), std::fs::Permissions::from_mode(0o755)).unwrap();
    c.spawn();
    c.wait_node_up();
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&db), 0o600);
    // The controller remembers the node as up from before the kill, so the agent may still be
    // starting: its directory is corrected when it does, within seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while mode(&c.dir.join("agent")) != 0o711 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(mode(&c.dir.join("agent")), 0o711);
    assert!(
        !readable_by(&other, &c, &db),
        "another user read the database"
    );
    let ok = c.wharf(&["cancel", &id.to_string()]);
    assert!(ok.status.success(), "{}", stderr(&ok));
}
