//! Text a user chooses (commands, paths, names) reaches other users' terminals escaped, and a
//! job's reason shows other users nothing from its spec.

use crate::harness::*;

/// The forged line and the terminal controls an attacker would try.
const NASTY: &str = "\x1b]0;pwned\x07\x1b[2J\x1b[31m\r\nState: COMPLETED\u{9b}1m\u{202e}";

fn assert_clean(what: &str, text: &str) {
    for (i, line) in text.lines().enumerate() {
        if let Some(c) = line
            .chars()
            .find(|&c| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}'))
        {
            panic!("{what}: raw {c:?} on line {}:\n{text}", i + 1);
        }
        assert!(
            !line.trim_start().starts_with("State: COMPLETED"),
            "{what}: forged line {line:?}"
        );
    }
    assert!(!text.contains('\r'), "{what}: raw CR");
}

#[test]
fn control_characters_are_escaped_and_reasons_stay_private() {
    if !can_run("control_characters_are_escaped_and_reasons_stay_private") {
        return;
    }
    let c = Cluster::start();
    let (owner, other) = (user("whctl-owner"), user("whctl-other"));

    // A name with controls is refused, saying why.
    let named = c.wharf_as(&owner, &["submit", "-J", NASTY, "--wrap", "true"]);
    assert!(!named.status.success());
    assert!(
        stderr(&named).contains("printable characters"),
        "{}",
        stderr(&named)
    );
    assert_clean("refused name", &stderr(&named));

    // Running: the command and the output path carry the controls.
    let script = format!("sleep 60 # {NASTY}");
    let out_file = format!("out-{NASTY}.txt");
    let running =
        submitted_id(&c.wharf_as(&owner, &["submit", "-o", &out_file, "--wrap", &script]));
    c.wait_running(running);
    // Failed: its working directory (a private path with controls) does not exist.
    let private = format!("/nonexistent/whctl-private-dir{NASTY}");
    let failed = submitted_id(&c.wharf_as(
        &owner,
        &[
            "submit",
            "--chdir",
            &private,
            "--wrap",
            "echo whctl-secret-arg",
        ],
    ));
    let job = c.wait_done(failed, std::time::Duration::from_secs(30));
    assert_eq!(job["state"], "FAILED", "{job}");
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("whctl-private-dir"),
        "the owner's reason names the directory: {job}"
    );

    // JSON keeps the exact values for the owner.
    let mine: serde_json::Value = serde_json::from_slice(
        &c.wharf_as(&owner, &["show", &running.to_string(), "--json"])
            .stdout,
    )
    .unwrap();
    assert_eq!(mine["spec"]["argv"][2], script.as_str());

    let ids = [running.to_string(), failed.to_string()];
    type Cli<'a> = Box<dyn Fn(&[&str]) -> std::process::Output + 'a>;
    let views: [(&str, Cli); 3] = [
        ("root", Box::new(|a: &[&str]| c.wharf(a))),
        ("owner", Box::new(|a: &[&str]| c.wharf_as(&owner, a))),
        ("other", Box::new(|a: &[&str]| c.wharf_as(&other, a))),
    ];
    for (who, run) in &views {
        for args in [
            vec!["queue"],
            vec!["queue", "--all"],
            vec!["show", &ids[0]],
            vec!["show", &ids[1]],
        ] {
            let out = run(&args);
            assert!(out.status.success(), "{who} {args:?}: {}", stderr(&out));
            assert_clean(&format!("{who} {args:?}"), &stdout(&out));
        }
    }
    // Root sees the command, escaped.
    let shown = stdout(&c.wharf(&["show", &ids[0]]));
    assert!(shown.contains("\\e]0;pwned\\x07"), "{shown}");

    // Another user sees that the job failed, not where or what it ran.
    for args in [
        vec!["show", ids[1].as_str()],
        vec!["show", ids[1].as_str(), "--json"],
        vec!["queue", "--all", "--json"],
    ] {
        let seen = stdout(&c.wharf_as(&other, &args));
        for secret in [
            "whctl-private-dir",
            "nonexistent",
            "whctl-secret-arg",
            "pwned",
        ] {
            assert!(
                !seen.contains(secret),
                "other {args:?} sees {secret:?}:\n{seen}"
            );
        }
    }
    let seen: serde_json::Value =
        serde_json::from_slice(&c.wharf_as(&other, &["show", &ids[1], "--json"]).stdout).unwrap();
    assert_eq!(seen["state"], "FAILED");
    assert!(seen["reason"].is_string(), "a generic reason: {seen}");
    assert!(c.wharf(&["cancel", &ids[0]]).status.success());
}
