//! A command whose output is closed early (`wharf queue --json | head -c 10`) ends quietly
//! (with status 141, what a shell shows for `cat` killed by SIGPIPE, where `println!` met the
//! closed pipe), instead of panicking.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::*;

#[test]
fn a_listing_into_a_closed_pipe_ends_quietly_without_a_panic() {
    if !can_run("a_listing_into_a_closed_pipe_ends_quietly_without_a_panic") {
        return;
    }
    let c = Cluster::start();
    let id = submitted_id(&c.wharf(&["submit", "--wrap", "true"]));
    c.wait_done(id, Duration::from_secs(15));
    for args in [
        &["queue", "--all", "--json"][..],
        &["acct", "-a", "--json"],
        &["report"],
        &["show", &id.to_string()],
        &["nodes"],
    ] {
        // The pipe's reader is gone before the command writes: its first write fails.
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let out = Command::new(wharf_bin())
            .args(args)
            .env("WHARF_SOCKET", &c.socket)
            .current_dir(&c.dir)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // 141, or 0 from a command that leaves off writing on its first failed write.
        assert!(
            matches!(out.status.code(), Some(0) | Some(141)),
            "{args:?}: {:?} {err}",
            out.status
        );
        assert_eq!(err, "", "{args:?}");
    }
}
