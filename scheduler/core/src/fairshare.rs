//! Fair share, the Fair Tree way (Slurm's `PriorityFlags=FAIR_TREE`).
//!
//! The account tree has shares at every level. At each level, siblings (sub-accounts and users)
//! are ranked by their level fair share `S / U`: their shares as a fraction of their siblings'
//! and their usage as a fraction of their siblings'. Users are then numbered depth-first in that
//! order, so every user of a better-ranked account comes before every user of a worse one: one
//! heavy user of an account lowers only that account (and, inside it, that user). A user's
//! factor is `rank / users`, in (0, 1]; tied siblings are ranked together.
//!
//! Usage is billing-weighted TRES-seconds, decayed with a half-life. Callers keep it in a
//! [`UsageLedger`] (no clock: every call takes the time) and pass [`UsageLedger::snapshot`] as
//! [`crate::State::usage`]; a pass adds what running jobs have used so far.
//!
//! ```
//! use wharf_core::{Assoc, UsageLedger};
//! let hour = 3_600_000;
//! let mut ledger = UsageLedger::new(hour);
//! ledger.record(&Assoc::new("physics", "ann"), 100.0, 0);
//! assert_eq!(ledger.snapshot(hour)[&Assoc::new("physics", "ann")], 50.0);
//! ```

use std::collections::BTreeMap;

use wharf_api::share::ShareRow;

use crate::config::Config;
use crate::state::{Assoc, Time};

/// Decayed usage per association.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UsageLedger {
    half_life: Time,
    entries: BTreeMap<Assoc, (f64, Time)>,
}

impl UsageLedger {
    /// An empty ledger; usage halves every `half_life` ms (0: never decays).
    pub fn new(half_life: Time) -> UsageLedger {
        UsageLedger {
            half_life,
            entries: BTreeMap::new(),
        }
    }

    fn decay(&self, value: f64, from: Time, to: Time) -> f64 {
        if self.half_life == 0 || to <= from {
            return value;
        }
        value * 0.5f64.powf((to - from) as f64 / self.half_life as f64)
    }

    /// Charges `assoc` for a run billed `rate` per second from `start` to `end`, each
    /// second's part decayed from when it was used (see [`accrued`]).
    pub fn record_run(&mut self, assoc: &Assoc, rate: f64, start: Time, end: Time) {
        let amount = accrued(rate, start, end, self.half_life);
        self.record(assoc, amount, end);
    }

    /// Adds `amount` billing-seconds charged to `assoc` at time `at`.
    pub fn record(&mut self, assoc: &Assoc, amount: f64, at: Time) {
        let (old, since) = self.entries.get(assoc).copied().unwrap_or((0.0, at));
        let base = at.max(since);
        let value = self.decay(old, since, base) + amount.max(0.0);
        self.entries.insert(assoc.clone(), (value, base));
    }

    /// Every association's usage decayed to `now`.
    pub fn snapshot(&self, now: Time) -> BTreeMap<Assoc, f64> {
        self.entries
            .iter()
            .map(|(a, &(v, since))| (a.clone(), self.decay(v, since, now)))
            .collect()
    }
}

/// What a run billed `rate` per second from `start` to `end` adds up to at `end`, each
/// second's part decayed (half-life `half_life` ms, 0: none) from when it was used, as if
/// charged second by second: `rate · h/ln 2 · (1 − 2^(−t/h))` for `t` seconds, `rate · t`
/// without decay. A job of a week under a week's half-life is charged 0.72 of its
/// undecayed usage at its end, the same as had it been charged as it went.
pub fn accrued(rate: f64, start: Time, end: Time, half_life: Time) -> f64 {
    let secs = end.saturating_sub(start) as f64 / 1000.0;
    if half_life == 0 {
        return rate * secs;
    }
    let h = half_life as f64 / 1000.0;
    // 1 − 2^(−t/h) without the cancellation of subtracting two numbers near 1.
    rate * h / std::f64::consts::LN_2 * -(-secs / h * std::f64::consts::LN_2).exp_m1()
}

/// One node of the tree: an account or a user.
#[derive(Debug)]
struct TreeNode {
    shares: f64,
    usage: f64,
    children: Vec<usize>,
    user: Option<Assoc>,
    name: String,
}

/// The fair-share factor of every association in `assocs` (and in `usage`).
pub fn factors(
    config: &Config,
    assocs: impl IntoIterator<Item = Assoc>,
    usage: &BTreeMap<Assoc, f64>,
) -> BTreeMap<Assoc, f64> {
    rank(&tree(config, assocs, usage))
}

/// The tree as `wharf share` shows it: every account and every association in `assocs` (and
/// in `usage`, of accounts still configured), depth first, each account's users (by name) before its sub-accounts (by
/// name), with the figures the ranking uses.
pub fn share_rows(
    config: &Config,
    assocs: impl IntoIterator<Item = Assoc>,
    usage: &BTreeMap<Assoc, f64>,
) -> Vec<ShareRow> {
    let tree = tree(config, assocs, usage);
    let factors = rank(&tree);
    let mut rows = Vec::new();
    push_rows(&tree, 0, 0, &factors, &mut rows);
    rows
}

fn push_rows(
    tree: &[TreeNode],
    i: usize,
    depth: u32,
    factors: &BTreeMap<Assoc, f64>,
    rows: &mut Vec<ShareRow>,
) {
    let level = Level::of(tree, i);
    let mut kids = tree[i].children.clone();
    kids.sort_by(|&a, &b| {
        let key = |c: usize| (tree[c].user.is_none(), &tree[c].name);
        key(a).cmp(&key(b)).then(a.cmp(&b))
    });
    for c in kids {
        let node = &tree[c];
        let fs = level.fs(tree, c);
        rows.push(ShareRow {
            depth,
            account: node
                .user
                .as_ref()
                .map_or(&node.name, |a| &a.account)
                .clone(),
            user: node.user.as_ref().map(|a| a.user.clone()),
            shares: node.shares,
            norm_shares: level.shares(tree, c),
            usage: node.usage,
            norm_usage: level.usage(tree, c),
            level_fs: fs.is_finite().then_some(fs),
            factor: node.user.as_ref().and_then(|a| factors.get(a).copied()),
        });
        if node.user.is_none() {
            push_rows(tree, c, depth + 1, factors, rows);
        }
    }
}

/// Every user's factor: its rank, best first, over the number of users.
fn rank(tree: &[TreeNode]) -> BTreeMap<Assoc, f64> {
    let groups = visit(tree, 0);
    let n = groups.iter().map(Vec::len).sum::<usize>() as f64;
    let mut out = BTreeMap::new();
    let mut before = 0usize;
    for group in groups {
        let rank = n - before as f64;
        before += group.len();
        for assoc in group {
            out.insert(assoc, rank / n);
        }
    }
    out
}

/// The account tree with every association in `assocs` (and in `usage`, of accounts still
/// configured) as a user under its account, and each node's usage summed over its subtree.
fn tree(
    config: &Config,
    assocs: impl IntoIterator<Item = Assoc>,
    usage: &BTreeMap<Assoc, f64>,
) -> Vec<TreeNode> {
    let mut tree = vec![TreeNode {
        shares: 1.0,
        usage: 0.0,
        children: Vec::new(),
        user: None,
        name: String::new(),
    }];
    let mut accounts: BTreeMap<&str, usize> = BTreeMap::new();
    for a in &config.accounts {
        tree.push(TreeNode {
            shares: a.shares as f64,
            usage: 0.0,
            children: Vec::new(),
            user: None,
            name: a.name.clone(),
        });
        accounts.insert(&a.name, tree.len() - 1);
    }
    for a in &config.accounts {
        let me = accounts[a.name.as_str()];
        // A parent that is unknown, or the account itself, hangs it under the root.
        let parent = a
            .parent
            .as_deref()
            .and_then(|p| accounts.get(p).copied())
            .filter(|&p| p != me && !is_below(&config.accounts, &accounts, p, me))
            .unwrap_or(0);
        tree[parent].children.push(me);
    }
    let user_shares: BTreeMap<(&str, &str), u32> = config
        .users
        .iter()
        .map(|u| ((u.account.as_str(), u.user.as_str()), u.shares))
        .collect();
    // Usage of an account no longer configured (a user's own account from before accounts
    // were set up, or one removed) ranks no one: it would stand at the root as a sibling of
    // the real accounts, taking a share and a place. Where no accounts are configured, every
    // user is its own.
    let configured =
        |a: &&Assoc| config.accounts.is_empty() || accounts.contains_key(a.account.as_str());
    let live = usage.keys().filter(configured).cloned();
    let mut all: Vec<Assoc> = assocs.into_iter().chain(live).collect();
    all.sort();
    all.dedup();
    for assoc in &all {
        let acct = match accounts.get(assoc.account.as_str()) {
            Some(&i) => i,
            None => {
                tree.push(TreeNode {
                    shares: 1.0,
                    usage: 0.0,
                    children: Vec::new(),
                    user: None,
                    name: assoc.account.clone(),
                });
                let i = tree.len() - 1;
                tree[0].children.push(i);
                accounts.insert(assoc.account.as_str(), i);
                i
            }
        };
        let shares = user_shares
            .get(&(assoc.account.as_str(), assoc.user.as_str()))
            .copied()
            .unwrap_or(1);
        tree.push(TreeNode {
            shares: shares as f64,
            usage: usage.get(assoc).copied().unwrap_or(0.0).max(0.0),
            children: Vec::new(),
            user: Some(assoc.clone()),
            name: assoc.user.clone(),
        });
        let i = tree.len() - 1;
        tree[acct].children.push(i);
    }
    sum_usage(&mut tree, 0);
    tree
}

/// The sums a level's siblings are weighed against.
struct Level {
    shares: f64,
    usage: f64,
}

impl Level {
    /// The level below node `i`: its children.
    fn of(tree: &[TreeNode], i: usize) -> Level {
        let kids = &tree[i].children;
        Level {
            shares: kids.iter().map(|&c| tree[c].shares).sum(),
            usage: kids.iter().map(|&c| tree[c].usage).sum(),
        }
    }

    /// Child `c`'s shares as a fraction of its siblings'.
    fn shares(&self, tree: &[TreeNode], c: usize) -> f64 {
        if self.shares > 0.0 {
            tree[c].shares / self.shares
        } else {
            0.0
        }
    }

    /// Child `c`'s usage as a fraction of its siblings'.
    fn usage(&self, tree: &[TreeNode], c: usize) -> f64 {
        if self.usage > 0.0 {
            tree[c].usage / self.usage
        } else {
            0.0
        }
    }

    /// Child `c`'s level fair share `S / U`: infinite where it used nothing but has shares.
    fn fs(&self, tree: &[TreeNode], c: usize) -> f64 {
        let (s, u) = (self.shares(tree, c), self.usage(tree, c));
        if u > 0.0 {
            s / u
        } else if s > 0.0 {
            f64::INFINITY
        } else {
            0.0
        }
    }
}

fn is_below(
    accounts: &[crate::config::Account],
    index: &BTreeMap<&str, usize>,
    node: usize,
    ancestor: usize,
) -> bool {
    // Walks `node`'s parents; a cycle through `ancestor` would make the tree a loop.
    let by_idx: BTreeMap<usize, Option<&str>> = accounts
        .iter()
        .map(|a| (index[a.name.as_str()], a.parent.as_deref()))
        .collect();
    let mut cur = node;
    for _ in 0..=accounts.len() {
        match by_idx
            .get(&cur)
            .copied()
            .flatten()
            .and_then(|p| index.get(p))
        {
            Some(&p) if p == ancestor => return true,
            Some(&p) => cur = p,
            None => return false,
        }
    }
    true
}

fn sum_usage(tree: &mut [TreeNode], i: usize) -> f64 {
    let children = tree[i].children.clone();
    let mut total = tree[i].usage;
    for c in children {
        total += sum_usage(tree, c);
    }
    tree[i].usage = total;
    total
}

/// The users under `i`, best first, in groups of equal rank. Siblings go best `S / U` first;
/// tied siblings are ranked together: their own rankings are merged level by level.
fn visit(tree: &[TreeNode], i: usize) -> Vec<Vec<Assoc>> {
    let kids = &tree[i].children;
    let level = Level::of(tree, i);
    let mut order: Vec<(f64, usize)> = kids.iter().map(|&c| (level.fs(tree, c), c)).collect();
    order.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| tree[a.1].name.cmp(&tree[b.1].name))
            .then(a.1.cmp(&b.1))
    });
    let mut out: Vec<Vec<Assoc>> = Vec::new();
    let mut k = 0;
    while k < order.len() {
        let mut merged: Vec<Vec<Assoc>> = Vec::new();
        let mut j = k;
        while j < order.len() && order[j].0 == order[k].0 {
            let c = order[j].1;
            let ranking = match &tree[c].user {
                Some(assoc) => vec![vec![assoc.clone()]],
                None => visit(tree, c),
            };
            for (depth, group) in ranking.into_iter().enumerate() {
                if merged.len() <= depth {
                    merged.push(Vec::new());
                }
                merged[depth].extend(group);
            }
            j += 1;
        }
        out.extend(merged);
        k = j;
    }
    out
}
