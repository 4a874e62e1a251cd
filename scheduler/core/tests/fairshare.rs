//! Fair Tree fair share: siblings ranked by usage against shares at each level, users
//! depth-first; one heavy user of an account cannot hurt another account.
// Configs are built field by field so each test shows only what it changes.
#![allow(clippy::field_reassign_with_default)]

mod common;
use std::collections::BTreeMap;

use common::*;
use wharf_core::fairshare::factors;
use wharf_core::*;

fn tree() -> Config {
    let mut c = Config::default();
    c.accounts = vec![
        Account {
            name: "physics".into(),
            parent: None,
            shares: 1,
        },
        Account {
            name: "bio".into(),
            parent: None,
            shares: 1,
        },
        Account {
            name: "bio-lab".into(),
            parent: Some("bio".into()),
            shares: 1,
        },
    ];
    c
}

fn assocs() -> Vec<Assoc> {
    vec![
        Assoc::new("physics", "ann"),
        Assoc::new("physics", "hog"),
        Assoc::new("bio", "bob"),
        Assoc::new("bio-lab", "cat"),
    ]
}

#[test]
fn a_heavy_user_lowers_only_their_own_account() {
    let usage: BTreeMap<Assoc, f64> = [
        (Assoc::new("physics", "hog"), 1000.0),
        (Assoc::new("bio", "bob"), 10.0),
        (Assoc::new("bio-lab", "cat"), 10.0),
    ]
    .into();
    let f = factors(&tree(), assocs(), &usage);
    let ann = f[&Assoc::new("physics", "ann")];
    let hog = f[&Assoc::new("physics", "hog")];
    let bob = f[&Assoc::new("bio", "bob")];
    let cat = f[&Assoc::new("bio-lab", "cat")];
    // bio used less against equal shares: all its users rank above physics's.
    assert!(bob.min(cat) > ann, "{f:?}");
    // Inside physics, ann (no usage) ranks above hog.
    assert!(ann > hog);
    assert_eq!(hog, 0.25, "lowest of four users");
    assert!(f.values().all(|&v| v > 0.0 && v <= 1.0));
}

#[test]
fn shares_weigh_against_usage() {
    let mut c = tree();
    c.accounts[0].shares = 10; // physics has 10x the shares of bio
    let usage: BTreeMap<Assoc, f64> = [
        (Assoc::new("physics", "ann"), 300.0),
        (Assoc::new("bio", "bob"), 100.0),
    ]
    .into();
    let f = factors(&c, assocs(), &usage);
    assert!(
        f[&Assoc::new("physics", "ann")] > f[&Assoc::new("bio", "bob")],
        "{f:?}"
    );
}

#[test]
fn no_usage_means_everyone_ties_at_one() {
    let f = factors(&tree(), assocs(), &BTreeMap::new());
    assert!(f.values().all(|&v| v == 1.0), "{f:?}");
}

#[test]
fn usage_decays_by_half_life_and_running_jobs_count() {
    let hour = 60 * MIN;
    let mut ledger = UsageLedger::new(hour);
    let hog = Assoc::new("physics", "hog");
    ledger.record(&hog, 400.0, 0);
    ledger.record(&hog, 0.0, 2 * hour);
    assert_eq!(ledger.snapshot(2 * hour)[&hog], 100.0);
    assert_eq!(ledger.snapshot(3 * hour)[&hog], 50.0);

    // The heavy user's job waits behind the light user's, submitted later.
    let mut config = tree();
    config.weights.age = 0;
    config.weights.job_size = 0;
    config.weights.width = 0;
    let mut heavy = job(1, "hog", 4, 0, 10, 0);
    heavy.assoc = hog.clone();
    let mut light = job(2, "bob", 4, 0, 10, 100);
    light.assoc = Assoc::new("bio", "bob");
    let mut state = State {
        nodes: vec![node("a", 4, 64, 0)],
        pending: vec![heavy, light],
        usage: ledger.snapshot(3 * hour),
        ..State::default()
    };
    let plan = schedule(3 * hour, &state, &config);
    assert_eq!(started(&plan), vec![2]);
    // Without past usage, a running job of hog's counts too.
    state.usage.clear();
    let mut r = running(9, "a", vec![], vec![], 0, 600);
    r.assoc = hog;
    r.allocs[0].cpu_ids = vec![];
    state.nodes.push(node("b", 8, 64, 0));
    r.allocs[0].node = "b".into();
    r.allocs[0].cpu_ids = (0..8).collect();
    state.running.push(r);
    let plan = schedule(3 * hour, &state, &config);
    assert!(plan.priority(2).unwrap().fairshare > plan.priority(1).unwrap().fairshare);
}

#[test]
fn a_running_jobs_use_decays_as_it_goes_and_its_end_charges_the_same() {
    let day = 24 * 60 * MIN;
    let week = 7 * day;
    // A job of a week under a week's half-life: each day's use has decayed since.
    let used = fairshare::accrued(1.0, 0, week, week);
    let by_day: f64 = (0..7)
        .map(|d| 86_400.0 * 0.5f64.powf((7 - d) as f64 / 7.0 - 0.5 / 7.0))
        .sum();
    assert!((used / by_day - 1.0).abs() < 1e-3, "{used} {by_day}");
    assert!((used / (7.0 * 86_400.0) - 0.5 / std::f64::consts::LN_2).abs() < 1e-9);
    // No half-life: rate times seconds; no time: nothing.
    assert_eq!(fairshare::accrued(2.0, 1_000, 4_000, 0), 6.0);
    assert_eq!(fairshare::accrued(2.0, 4_000, 4_000, week), 0.0);
    // What the share tree counts for the running job is what its end then charges.
    let mut config = tree();
    config.half_life = week;
    let hog = Assoc::new("physics", "hog");
    let state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![RunningJob {
            assoc: hog.clone(),
            ..running(1, "a", (0..4).collect(), vec![], 0, 20 * 24 * 60)
        }],
        ..State::default()
    };
    let row = |rows: &[wharf_api::share::ShareRow]| {
        rows.iter()
            .find(|r| r.user.as_deref() == Some("hog"))
            .unwrap()
            .usage
    };
    let running = row(&fair_share(2 * week, &state, &config));
    let mut ledger = UsageLedger::new(week);
    ledger.record_run(&hog, 4.0, 0, 2 * week);
    let ended = State {
        running: vec![],
        usage: ledger.snapshot(2 * week),
        ..state
    };
    let charged = row(&fair_share(2 * week, &ended, &config));
    assert!((running - charged).abs() < 1e-6, "{running} {charged}");
    // Two weeks on 4 CPUs, each second halved every week since: 3/4 of a week's worth × 4/ln 2.
    assert!((charged - 4.0 * 0.75 * 7.0 * 86_400.0 / std::f64::consts::LN_2).abs() < 1e-3);
}

#[test]
fn the_share_tree_shows_each_level_and_the_factors_priority_uses() {
    let usage: BTreeMap<Assoc, f64> = [
        (Assoc::new("physics", "hog"), 300.0),
        (Assoc::new("physics", "ann"), 100.0),
        (Assoc::new("bio-lab", "cat"), 50.0),
    ]
    .into();
    let rows = fairshare::share_rows(&tree(), assocs(), &usage);
    let f = factors(&tree(), assocs(), &usage);
    let line = |r: &wharf_api::share::ShareRow| {
        (
            r.depth,
            r.account.clone(),
            r.user.clone(),
            r.norm_shares,
            r.usage,
            r.norm_usage,
            r.level_fs,
        )
    };
    // Depth first, an account's users before its sub-accounts, each by name.
    assert_eq!(
        rows.iter().map(line).collect::<Vec<_>>(),
        vec![
            (
                0,
                "bio".to_string(),
                None,
                0.5,
                50.0,
                50.0 / 450.0,
                Some(0.5 / (50.0 / 450.0))
            ),
            (
                1,
                "bio".to_string(),
                Some("bob".to_string()),
                0.5,
                0.0,
                0.0,
                None
            ),
            (1, "bio-lab".to_string(), None, 0.5, 50.0, 1.0, Some(0.5)),
            (
                2,
                "bio-lab".to_string(),
                Some("cat".to_string()),
                1.0,
                50.0,
                1.0,
                Some(1.0)
            ),
            (
                0,
                "physics".to_string(),
                None,
                0.5,
                400.0,
                400.0 / 450.0,
                Some(0.5 / (400.0 / 450.0))
            ),
            (
                1,
                "physics".to_string(),
                Some("ann".to_string()),
                0.5,
                100.0,
                0.25,
                Some(2.0)
            ),
            (
                1,
                "physics".to_string(),
                Some("hog".to_string()),
                0.5,
                300.0,
                0.75,
                Some(0.5 / 0.75)
            ),
        ]
    );
    // Accounts carry no factor; each user carries the one priority takes.
    for r in &rows {
        match &r.user {
            None => assert_eq!(r.factor, None),
            Some(u) => assert_eq!(r.factor, Some(f[&Assoc::new(&r.account, u)]), "{r:?}"),
        }
    }
    // bio's users first (bob, who used nothing, then cat), then physics's (ann, then hog).
    let by_factor = |u: &str| {
        rows.iter()
            .find(|r| r.user.as_deref() == Some(u))
            .unwrap()
            .factor
    };
    assert_eq!(by_factor("bob"), Some(1.0));
    assert_eq!(by_factor("cat"), Some(0.75));
    assert_eq!(by_factor("ann"), Some(0.5));
    assert_eq!(by_factor("hog"), Some(0.25));
}

#[test]
fn the_share_tree_counts_running_jobs_use_so_far() {
    // hog's job has run for an hour on 4 CPUs (billing 1 per CPU-second by default).
    let state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![RunningJob {
            assoc: Assoc::new("physics", "hog"),
            ..running(1, "a", (0..4).collect(), vec![], 0, 120)
        }],
        pending: vec![job(2, "ann", 1, 0, 10, 0)],
        ..State::default()
    };
    let config = tree();
    let rows = fair_share(60 * MIN, &state, &config);
    let hog = rows
        .iter()
        .find(|r| r.user.as_deref() == Some("hog"))
        .unwrap();
    // Each second decayed since it was used: a little under 4 CPU-hours a week's half-life on.
    let expected = fairshare::accrued(4.0, 0, 60 * MIN, config.half_life);
    assert!((hog.usage - expected).abs() < 1e-6, "{hog:?}");
    assert!(expected < 4.0 * 3600.0 && expected > 0.997 * 4.0 * 3600.0);
    let ann = rows
        .iter()
        .find(|r| r.user.as_deref() == Some("ann"))
        .unwrap();
    assert_eq!((ann.account.as_str(), ann.usage), ("ann", 0.0));
    assert!(ann.factor.unwrap() > hog.factor.unwrap());
}

#[test]
fn the_share_tree_gives_each_user_the_factor_a_pass_gives_its_jobs() {
    let mut c = tree();
    c.users = vec![UserShares {
        account: "physics".into(),
        user: "ann".into(),
        shares: 3,
    }];
    let mut state = State {
        nodes: vec![node("a", 8, 64, 0)],
        running: vec![RunningJob {
            assoc: Assoc::new("bio", "bob"),
            ..running(1, "a", (0..8).collect(), vec![], 0, 120)
        }],
        usage: [
            (Assoc::new("physics", "hog"), 50_000.0),
            (Assoc::new("physics", "ann"), 20_000.0),
        ]
        .into(),
        ..State::default()
    };
    for (id, (account, user)) in (10..).zip([
        ("physics", "ann"),
        ("physics", "hog"),
        ("bio", "bob"),
        ("bio-lab", "cat"),
        ("elsewhere", "dan"),
    ]) {
        let mut j = job(id, user, 1, 0, 10, 0);
        j.assoc = Assoc::new(account, user);
        state.pending.push(j);
    }
    let now = 30 * MIN;
    let plan = schedule(now, &state, &c);
    let rows = fair_share(now, &state, &c);
    for j in &state.pending {
        let row = rows
            .iter()
            .find(|r| r.account == j.assoc.account && r.user.as_deref() == Some(&j.assoc.user))
            .unwrap_or_else(|| panic!("no line for {:?}: {rows:?}", j.assoc));
        assert_eq!(
            row.factor.unwrap(),
            plan.priority(j.id).unwrap().fairshare,
            "{row:?}"
        );
    }
}

#[test]
fn usage_of_an_account_no_longer_configured_ranks_no_one() {
    let config = tree();
    let usage: BTreeMap<Assoc, f64> = [
        (Assoc::new("physics", "hog"), 300.0),
        (Assoc::new("bio", "bob"), 100.0),
    ]
    .into();
    let mut stale = usage.clone();
    // ann's own account from before accounts were set up.
    stale.insert(Assoc::new("ann", "ann"), 50.0);
    let rows = |u: &BTreeMap<Assoc, f64>| fairshare::share_rows(&config, [], u);
    assert_eq!(rows(&stale), rows(&usage));
    assert!(rows(&stale).iter().all(|r| r.account != "ann"));
    assert_eq!(factors(&config, [], &stale), factors(&config, [], &usage));
    // Without configured accounts every user is its own account.
    let own = fairshare::share_rows(&Config::default(), [], &stale);
    assert!(own.iter().any(|r| r.account == "ann"));
}
