//! `wharf acct`: job records by user, state, ids and time window, in columns, parsable or JSON;
//! users see their own records, admins anyone's.

use std::time::Duration;

use crate::harness::*;

#[test]
fn records_are_listed_filtered_and_kept_private() {
    if !can_run("records_are_listed_filtered_and_kept_private") {
        return;
    }
    let c = Cluster::start();
    let (alice, bob) = (user("wharf-alice"), user("wharf-bob"));
    let ok = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "true"]));
    let bad = submitted_id(&c.wharf_as(&alice, &["submit", "-J", "fails", "--wrap", "exit 3"]));
    let bobs = submitted_id(&c.wharf_as(&bob, &["submit", "--wrap", "true"]));
    for id in [ok, bad, bobs] {
        c.wait_done(id, Duration::from_secs(30));
    }
    let acct = |who: Option<&User>, args: &[&str]| {
        let args = [&["acct"][..], args].concat();
        match who {
            Some(u) => c.wharf_as(u, &args),
            None => c.wharf(&args),
        }
    };
    let lines = |out: std::process::Output| -> Vec<String> {
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).lines().map(str::to_string).collect()
    };

    // Her own, in order, as sacct -p prints them.
    let mine = lines(acct(
        Some(&alice),
        &["-p", "-o", "JobID,JobName,State,ExitCode,User"],
    ));
    assert_eq!(mine[0], "JobID|JobName|State|ExitCode|User|");
    assert_eq!(mine[1], format!("{ok}|wrap|COMPLETED|0:0|wharf-alice|"));
    assert_eq!(mine[2], format!("{bad}|fails|FAILED|3:0|wharf-alice|"));
    assert_eq!(mine.len(), 3, "bob's job is not hers: {mine:?}");
    let failed = lines(acct(
        Some(&alice),
        &["-n", "-p", "-o", "JobID", "-s", "failed"],
    ));
    assert_eq!(failed, [format!("{bad}|")]);
    // sacct -P (no `|` at the end), --delimiter, -X, raw times and NAME%N widths.
    let raw = lines(acct(
        Some(&alice),
        &[
            "-n",
            "-P",
            "-X",
            "-o",
            "JobID,TimelimitRaw,ElapsedRaw",
            "-j",
            &bad.to_string(),
        ],
    ));
    let fields: Vec<&str> = raw[0].split('|').collect();
    assert_eq!(fields[..2], [bad.to_string().as_str(), "60"], "{raw:?}");
    assert!(
        fields[2].parse::<u64>().is_ok() && fields.len() == 3,
        "{raw:?}"
    );
    let comma = lines(acct(
        Some(&alice),
        &[
            "-n",
            "-P",
            "--delimiter",
            ",",
            "-o",
            "JobID,State",
            "-j",
            &bad.to_string(),
        ],
    ));
    assert_eq!(comma, [format!("{bad},FAILED")]);
    let narrow = lines(acct(
        Some(&alice),
        &["-n", "-o", "JobID,State%4", "-j", &bad.to_string()],
    ));
    assert_eq!(narrow, [format!("{bad}  FAI+")]);
    let out = acct(Some(&alice), &["-o", "JobID%0"]);
    assert!(
        stderr(&out).contains("the width after % is 1 to 1000"),
        "{}",
        stderr(&out)
    );
    assert!(!acct(Some(&alice), &["-X", "--steps"]).status.success());

    // Not another user's, unless an admin asks.
    let out = acct(Some(&alice), &["-u", "wharf-bob"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("only your own"), "{}", stderr(&out));
    let all = lines(acct(None, &["-a", "-n", "-p", "-o", "JobID,User"]));
    assert_eq!(all.len(), 3, "{all:?}");
    let bob_only = lines(acct(None, &["-u", "wharf-bob", "-n", "-p", "-o", "JobID"]));
    assert_eq!(bob_only, [format!("{bobs}|")]);
    let picked = lines(acct(
        None,
        &[
            "-a",
            "-j",
            &format!("{ok},{bobs}"),
            "-n",
            "-p",
            "-o",
            "JobID",
        ],
    ));
    assert_eq!(picked, [format!("{ok}|"), format!("{bobs}|")]);

    // The binary called by Slurm's names is those commands, with their flags.
    let slurm = |name: &str, args: &[&str]| -> Vec<String> {
        let link = slurm_link(&c.home(&alice), name);
        lines(as_user(
            &alice,
            &c.home(&alice),
            link.to_str().unwrap(),
            args,
            &c.socket,
        ))
    };
    let failed = slurm("sacct", &["-X", "-P", "-n", "-o", "JobID,State", "-s", "F"]);
    assert_eq!(failed, [format!("{bad}|FAILED")]);
    let ended = slurm("squeue", &["-h", "-t", "CD,F", "-u", "wharf-alice"]);
    assert_eq!(ended.len(), 2, "{ended:?}");
    assert!(ended.iter().all(|l| !l.starts_with("JOBID")), "{ended:?}");
    let mut ids = slurm(
        "squeue",
        &["-h", "-t", "all", "-u", "wharf-alice", "-o", "%i %t"],
    );
    ids.sort();
    let mut want = [format!("{ok} CD"), format!("{bad} F")];
    want.sort();
    assert_eq!(ids, want);

    // A window that ended before they were submitted holds none of them.
    let none = lines(acct(
        Some(&alice),
        &["-n", "-S", "2020-01-01", "-E", "2020-01-02"],
    ));
    assert!(none.is_empty(), "{none:?}");
    let json: serde_json::Value =
        serde_json::from_str(&stdout(&acct(Some(&alice), &["--json", "-S", "now-1h"]))).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 2);
    assert!(json[0]["spec"]["account"].is_string(), "{json}");

    // The report adds up the same records: every user's for root, her own for alice.
    let report = |who: Option<&User>| -> serde_json::Value {
        let out = match who {
            Some(u) => c.wharf_as(u, &["report", "-S", "now-1h", "--json"]),
            None => c.wharf(&["report", "-S", "now-1h", "--json"]),
        };
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(&stdout(&out)).unwrap()
    };
    let all = report(None);
    assert_eq!(all["total"]["jobs"], 3, "{all}");
    let records: serde_json::Value =
        serde_json::from_str(&stdout(&acct(None, &["-a", "--json", "-S", "now-1h"]))).unwrap();
    let held_cpu_hours: f64 = records
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            let ms = j["end_time"].as_u64().unwrap() - j["start_time"].as_u64().unwrap();
            j["resources"]["cpus"].as_f64().unwrap() * ms as f64 / 3_600_000.0
        })
        .sum();
    let reported = all["total"]["cpu_hours"].as_f64().unwrap();
    assert!(
        (reported - held_cpu_hours).abs() < 1e-9,
        "{reported} vs {held_cpu_hours}"
    );
    let users: Vec<&str> = all["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert!(users.iter().any(|u| u.ends_with("/wharf-bob")), "{users:?}");
    let hers = report(Some(&alice));
    assert_eq!(hers["total"]["jobs"], 2, "{hers}");
    let text = stdout(&c.wharf(&["report", "-S", "now-1h"]));
    assert!(
        text.contains("ACCOUNT/USER") && text.contains("CPU-HOURS"),
        "{text}"
    );
    // Its columns say what they count: runs, and billing in hours.
    assert!(
        text.contains(" RUNS ") && text.contains("BILLING-HOURS") && text.contains(" runs\n"),
        "{text}"
    );

    // Bad input names the problem.
    for (args, says) in [
        (&["-s", "DONE"][..], "unknown state \"DONE\""),
        (&["-S", "yesterday"][..], "--starttime"),
        (&["-o", "JobID,Bogus"][..], "unknown column \"Bogus\""),
        (&["-j", "12x"][..], "not a job id"),
    ] {
        let out = acct(Some(&alice), args);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

/// Every file under `dir` named `name`.
fn find(dir: &std::path::Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(find(&p, name));
        } else if e.file_name() == name {
            out.push(p);
        }
    }
    out
}

/// The ledger on a real PostgreSQL server (started by the test): jobs that end while the
/// database is stopped are spooled, the controller keeps running jobs, and once the database
/// is back every job is in `wharf acct` exactly once and in the report.
#[test]
fn records_on_postgres_survive_a_database_outage_once_each() {
    if !can_run("records_on_postgres_survive_a_database_outage_once_each") {
        return;
    }
    let Some(mut server) = wharf_controller::ledger::pg_server::PgServer::start() else {
        return;
    };
    let pg = server.database();
    let c = Cluster::start_with(&format!(
        "[accounting]\nstore = \"postgres\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"wharf\"\n\
         dbname = \"{}\"\npassword_file = \"{}\"\n",
        pg.port.unwrap(),
        pg.dbname.as_deref().unwrap(),
        pg.password_file.as_ref().unwrap().display()
    ));
    let alice = user("wharf-alice");
    let ids = |out: std::process::Output| -> Vec<u64> {
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
            .lines()
            .map(|l| l.trim_end_matches('|').parse().unwrap())
            .collect()
    };
    let listed = || ids(c.wharf(&["acct", "-a", "-n", "-p", "-o", "JobID", "-S", "now-1h"]));
    let first = submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "true"]));
    c.wait_done(first, Duration::from_secs(30));
    assert_eq!(listed(), [first]);

    server.stop();
    let during: Vec<u64> = (0..3)
        .map(|_| submitted_id(&c.wharf_as(&alice, &["submit", "--wrap", "true"])))
        .collect();
    for &id in &during {
        let job = c.wait_done(id, Duration::from_secs(30));
        assert_eq!(job["state"], "COMPLETED", "{job}");
    }
    let out = c.wharf(&["acct", "-a", "-S", "now-1h"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("unreachable"), "{}", stderr(&out));
    let spool = find(&c.dir, "ledger.spool");
    assert_eq!(spool.len(), 1, "{spool:?}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&spool[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    server.start_again();
    let mut want = vec![first];
    want.extend(&during);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let out = c.wharf(&["acct", "-a", "-n", "-p", "-o", "JobID", "-S", "now-1h"]);
        if out.status.success() && ids(out) == want {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the spool was not replayed: {}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        find(&c.dir, "ledger.spool").is_empty(),
        "replayed, then removed"
    );
    let out = c.wharf(&["report", "-S", "now-1h", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["total"]["jobs"], 4, "{report}");
}
