use std::collections::BTreeMap;

use wharf_api::admin::{AdminAction, AdminChange, AdminKind, Source};
use wharf_core::{Account, Config, Partition, PartitionState, UserShares};

use super::Registry;
use crate::store::AssocRow;

fn change(
    kind: AdminKind,
    action: AdminAction,
    name: &str,
    settings: &[(&str, &str)],
) -> AdminChange {
    AdminChange {
        kind,
        action,
        name: name.into(),
        account: None,
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn user(action: AdminAction, name: &str, account: &str, settings: &[(&str, &str)]) -> AdminChange {
    AdminChange {
        account: Some(account.into()),
        ..change(AdminKind::User, action, name, settings)
    }
}

/// The config file: account `physics` with user ann, partition `batch`.
fn base() -> Config {
    let mut c = Config::default();
    c.accounts.push(Account {
        name: "physics".into(),
        parent: None,
        shares: 2,
    });
    c.users.push(UserShares {
        user: "ann".into(),
        account: "physics".into(),
        shares: 1,
    });
    c.partitions.push(Partition::new("batch", &[]));
    c
}

#[test]
fn the_file_seeds_what_the_database_lacks_and_the_database_wins() {
    let r = Registry::from_config(base());
    assert_eq!(r.config(), base(), "the file alone gives the file's config");
    let rows = [
        AssocRow {
            kind: AdminKind::Account,
            key: "physics".into(),
            record: Some(r#"{"name":"physics","shares":7}"#.into()),
        },
        AssocRow {
            kind: AdminKind::Partition,
            key: "batch".into(),
            record: None,
        },
        AssocRow {
            kind: AdminKind::Qos,
            key: "gold".into(),
            record: Some(r#"{"name":"gold","priority":10,"grp_jobs":3}"#.into()),
        },
    ];
    let r = Registry::load(base(), &rows).unwrap();
    let c = r.config();
    assert_eq!(c.accounts[0].shares, 7);
    assert!(c.partitions.is_empty(), "a removal in the database holds");
    assert_eq!(c.qos[0].priority, 10);
    assert_eq!(c.limits.qos["gold"].grp_jobs, Some(3));
    let a = r.associations();
    assert_eq!(a.accounts[0].source, Source::Database);
    assert_eq!(a.users[0].source, Source::Config);
}

#[test]
fn a_tree_of_accounts_users_and_limits_becomes_the_schedulers_config() {
    let mut r = Registry::from_config(base());
    let steps = [
        change(
            AdminKind::Account,
            AdminAction::Add,
            "theory",
            &[
                ("parent", "physics"),
                ("grp_tres", "gpu=16,cpu=64"),
                ("coordinators", "bob"),
            ],
        ),
        user(
            AdminAction::Add,
            "ann",
            "theory",
            &[("default", "true"), ("max_jobs", "2")],
        ),
        change(AdminKind::Qos, AdminAction::Add, "low", &[]),
        change(
            AdminKind::Qos,
            AdminAction::Add,
            "high",
            &[
                ("priority", "100"),
                ("preempt", "low"),
                ("max_wall", "1d"),
                ("preempt_mode", "cancel"),
            ],
        ),
        change(
            AdminKind::Partition,
            AdminAction::Modify,
            "batch",
            &[
                ("state", "drain"),
                ("max_time", "2h"),
                ("preempt_mode", "requeue"),
                ("allow_accounts", "physics,theory"),
                ("allow_groups", "gpuusers"),
            ],
        ),
    ];
    for s in &steps {
        r.apply(s).unwrap();
    }
    let c = r.config();
    let theory = c.accounts.iter().find(|a| a.name == "theory").unwrap();
    assert_eq!(theory.parent.as_deref(), Some("physics"));
    assert_eq!(c.limits.accounts["theory"].grp_tres.gpu, Some(16));
    assert_eq!(c.users[0].account, "theory", "the new default comes first");
    assert_eq!(c.users.len(), 2);
    assert_eq!(
        c.limits.users[&wharf_core::Assoc::new("theory", "ann")].max_jobs,
        Some(2)
    );
    assert_eq!(c.limits.qos["high"].max_wall, Some(86_400_000));
    assert_eq!(c.limits.qos["high"].preempt, ["low"]);
    assert_eq!(c.partitions[0].state, PartitionState::Drain);
    assert_eq!(c.partitions[0].max_time, Some(7_200_000));
    assert_eq!(
        c.partitions[0].preempt_mode,
        wharf_core::PreemptMode::Requeue
    );
    assert_eq!(c.partitions[0].allow_accounts, ["physics", "theory"]);
    assert_eq!(c.partitions[0].allow_groups, ["gpuusers"]);
    assert_eq!(
        c.limits.qos["high"].preempt_mode,
        Some(wharf_core::PreemptMode::Cancel)
    );
    assert_eq!(r.lineage("theory")[0].coordinators, ["bob"]);
    let ann: Vec<bool> = r
        .associations()
        .users
        .iter()
        .map(|e| e.def.default)
        .collect();
    assert_eq!(ann, [false, true], "one default per user");
}

#[test]
fn nonsense_is_refused_with_the_problem_and_changes_nothing() {
    let mut r = Registry::from_config(base());
    r.apply(&change(
        AdminKind::Account,
        AdminAction::Add,
        "theory",
        &[("parent", "physics")],
    ))
    .unwrap();
    r.apply(&change(AdminKind::Qos, AdminAction::Add, "low", &[]))
        .unwrap();
    let before = r.clone();
    for (c, want) in [
        (
            change(AdminKind::Account, AdminAction::Add, "a b", &[]),
            "a name is 1 to 64",
        ),
        (
            change(
                AdminKind::Account,
                AdminAction::Add,
                "x",
                &[("parent", "nope")],
            ),
            "parent \"nope\" is not an account",
        ),
        (
            change(
                AdminKind::Account,
                AdminAction::Modify,
                "physics",
                &[("parent", "theory")],
            ),
            "would make a cycle",
        ),
        (
            change(
                AdminKind::Account,
                AdminAction::Modify,
                "physics",
                &[("parent", "physics")],
            ),
            "would make a cycle",
        ),
        (
            change(
                AdminKind::Account,
                AdminAction::Add,
                "x",
                &[("shares", "0")],
            ),
            "shares \"0\"",
        ),
        (
            change(AdminKind::Account, AdminAction::Add, "physics", &[]),
            "account physics exists",
        ),
        (
            change(AdminKind::Account, AdminAction::Remove, "physics", &[]),
            "has child account theory",
        ),
        (
            change(AdminKind::Account, AdminAction::Remove, "nope", &[]),
            "account nope does not exist",
        ),
        (
            change(
                AdminKind::Qos,
                AdminAction::Add,
                "high",
                &[("preempt", "low,gold")],
            ),
            "preempt names \"gold\"",
        ),
        (
            user(AdminAction::Add, "bob", "nope", &[]),
            "account \"nope\" is not an account",
        ),
        (
            user(AdminAction::Modify, "ann", "theory", &[("default", "true")]),
            "no such association",
        ),
        (
            change(AdminKind::User, AdminAction::Add, "bob", &[]),
            "name the account",
        ),
        (
            change(
                AdminKind::Partition,
                AdminAction::Modify,
                "batch",
                &[("state", "closed")],
            ),
            "use UP, DOWN",
        ),
    ] {
        let mut next = r.clone();
        let err = next.apply(&c).unwrap_err();
        assert!(err.contains(want), "{c:?}: {err}");
        assert_eq!(r, before);
    }
    r.apply(&change(
        AdminKind::Qos,
        AdminAction::Add,
        "high",
        &[("preempt", "low")],
    ))
    .unwrap();
    let err = r
        .clone()
        .apply(&change(AdminKind::Qos, AdminAction::Remove, "low", &[]))
        .unwrap_err();
    assert!(err.contains("in qos high's preempt list"), "{err}");
    let mut granted = r.clone();
    granted
        .apply(&change(AdminKind::Qos, AdminAction::Add, "gold", &[]))
        .unwrap();
    granted
        .apply(&change(
            AdminKind::Account,
            AdminAction::Modify,
            "physics",
            &[("qos", "gold")],
        ))
        .unwrap();
    let err = granted
        .clone()
        .apply(&change(AdminKind::Qos, AdminAction::Remove, "gold", &[]))
        .unwrap_err();
    assert!(
        err.contains("qos gold is in account physics's qos list"),
        "{err}"
    );

    // Jobs of QoS that preempt each other would requeue each other without end.
    let before = r.clone();
    for (c, want) in [
        (
            change(
                AdminKind::Qos,
                AdminAction::Modify,
                "low",
                &[("preempt", "low")],
            ),
            "cycle (low preempts low)",
        ),
        (
            change(
                AdminKind::Qos,
                AdminAction::Modify,
                "low",
                &[("preempt", "high")],
            ),
            "cycle (low preempts high preempts low)",
        ),
        (
            change(
                AdminKind::Qos,
                AdminAction::Add,
                "mid",
                &[("preempt", "high")],
            ),
            "",
        ),
    ] {
        let mut next = r.clone();
        match next.apply(&c) {
            Err(err) => assert!(!want.is_empty() && err.contains(want), "{c:?}: {err}"),
            Ok(_) => assert!(want.is_empty(), "{c:?} was taken"),
        }
        if !want.is_empty() {
            assert_eq!(r, before);
        } else {
            r = next;
        }
    }
    // One already there (from before such lists were checked) refuses only changes that
    // make another, not every change.
    let mut old = r.clone();
    old.assocs
        .qos
        .iter_mut()
        .find(|e| e.def.name == "low")
        .unwrap()
        .def
        .preempt = vec!["low".into()];
    old.apply(&change(AdminKind::Account, AdminAction::Add, "chem", &[]))
        .unwrap();
    // A longer cycle: low preempts mid, which preempts high, which preempts low.
    let err = r
        .clone()
        .apply(&change(
            AdminKind::Qos,
            AdminAction::Modify,
            "low",
            &[("preempt", "mid")],
        ))
        .unwrap_err();
    assert!(
        err.contains("cycle (low preempts mid preempts high preempts low)"),
        "{err}"
    );
}

#[test]
fn an_account_with_users_cannot_be_removed_and_a_removed_default_moves_on() {
    let mut r = Registry::from_config(base());
    r.apply(&change(AdminKind::Account, AdminAction::Add, "theory", &[]))
        .unwrap();
    r.apply(&user(AdminAction::Add, "ann", "theory", &[]))
        .unwrap();
    let err = r
        .clone()
        .apply(&change(
            AdminKind::Account,
            AdminAction::Remove,
            "physics",
            &[],
        ))
        .unwrap_err();
    assert!(err.contains("still has users (ann)"), "{err}");
    let (old, new, rows) = r
        .apply(&user(AdminAction::Remove, "ann", "physics", &[]))
        .unwrap();
    assert_eq!(old.unwrap()["default"], true);
    assert!(new.is_none());
    // The removal and ann's other association, now her default, are both stored.
    let keys: Vec<(&str, bool)> = rows
        .iter()
        .map(|r| (r.key.as_str(), r.record.is_some()))
        .collect();
    assert_eq!(keys, [("ann@theory", true), ("ann@physics", false)]);
    assert!(r.associations().users[0].def.default);
    r.apply(&change(
        AdminKind::Account,
        AdminAction::Remove,
        "physics",
        &[],
    ))
    .unwrap();
}
