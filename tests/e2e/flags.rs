//! Command-line flags win over the configuration file, as a new user expects.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

/// `wharf controller --socket PATH` (and `wharf dev`'s, which ignored it) listens at PATH, not
/// at the file's (or the default) socket, so the same flag on the client finds it; a TCP
/// address there is refused with what to use.
#[test]
fn controller_listens_on_the_socket_its_flag_names() {
    if !can_run("controller_listens_on_the_socket_its_flag_names") {
        return;
    }
    let dir = scratch("wharf-flags-");
    let config = dir.path().join("wharf.toml");
    let from_file = dir.path().join("from-file.sock");
    // The dev's agent gets a cgroup parent of its own: one per agent on a machine.
    let parent = format!("wharf-flags-{}", std::process::id());
    std::fs::write(
        &config,
        format!(
            "[controller]\nsocket = \"{}\"\n[agent]\ncgroup_parent = \"{parent}\"\nimage_store = \"{}\"\n",
            from_file.display(),
            dir.path().join("images").display()
        ),
    )
    .unwrap();
    for (command, dir_flag) in [("controller", "--state-dir"), ("dev", "--data-dir")] {
        let socket = dir.path().join(format!("{command}.sock"));
        let mut child = Command::new(wharf_bin())
            .args(["--socket", socket.to_str().unwrap(), command, "--config"])
            .arg(&config)
            .arg(dir_flag)
            .arg(dir.path().join(command))
            .env_remove("WHARF_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let answered = loop {
            let out = Command::new(wharf_bin())
                .args(["--socket", socket.to_str().unwrap(), "queue"])
                .output()
                .unwrap();
            if out.status.success() || Instant::now() > deadline {
                break out.status.success();
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let _ = child.kill();
        let _ = child.wait();
        remove_cgroup_parent(&parent);
        assert!(
            answered,
            "{command}: no controller answered at the --socket path"
        );
        assert!(
            !from_file.exists(),
            "{command}: the controller listened at the file's socket too"
        );
    }

    let out = Command::new(wharf_bin())
        .args(["--socket", "tcp://127.0.0.1:1", "controller", "--config"])
        .arg(&config)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--listen"), "{err}");
}
