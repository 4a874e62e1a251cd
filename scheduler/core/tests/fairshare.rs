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
