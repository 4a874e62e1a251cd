//! Associations managed at run time (`wharf admin`): the accounts, users' associations, QoS
//! and partitions the scheduler works with, merged from the config file and the database.
//!
//! The rule: the config file seeds what the database does not have. An object no `wharf
//! admin` change has touched is the config file's (edit the file and restart to change it).
//! Once changed (or added, or removed) with `wharf admin`, its definition is kept in the
//! database and wins over the file, across restarts; a removal is kept too, so a removed object
//! the file still defines stays removed. `wharf admin ... show` says where each comes from.
//!
//! [`Registry`] holds the merge; a change is applied to a copy, checked whole
//! ([`Registry::validate`]), stored with its audit, and only then replaces the registry and
//! the scheduler's config, so a refused change changes nothing and the next pass sees an
//! accepted one.

use std::collections::BTreeMap;

mod convert;
pub(crate) use convert::state_name;
pub mod settings;

use wharf_api::admin::{
    AccountDef, AdminAction, AdminChange, AdminKind, AssocCaps, Associations, PartitionDef, QosDef,
    Source, Sourced, UserDef,
};
use wharf_core::Config;

use crate::store::AssocRow;
use wharf_api::job::is_name;

/// The merged associations and the config file's scheduler config they came with.
#[derive(Debug, Clone, PartialEq)]
pub struct Registry {
    base: Config,
    assocs: Associations,
}

/// The store key of a user association.
pub fn user_key(user: &str, account: &str) -> String {
    format!("{user}@{account}")
}

/// Objects with a key in the store.
trait Keyed {
    fn key(&self) -> String;
}

impl Keyed for AccountDef {
    fn key(&self) -> String {
        self.name.clone()
    }
}
impl Keyed for UserDef {
    fn key(&self) -> String {
        user_key(&self.user, &self.account)
    }
}
impl Keyed for QosDef {
    fn key(&self) -> String {
        self.name.clone()
    }
}
impl Keyed for PartitionDef {
    fn key(&self) -> String {
        self.name.clone()
    }
}

/// Replaces (or adds, or with `None` removes) the object with `key`, from the database.
fn put<T: Keyed + serde::de::DeserializeOwned>(
    list: &mut Vec<Sourced<T>>,
    key: &str,
    record: Option<&str>,
) -> Result<(), serde_json::Error> {
    let at = list.iter().position(|e| e.def.key() == key);
    match (record, at) {
        (Some(text), at) => {
            let entry = Sourced {
                def: serde_json::from_str(text)?,
                source: Source::Database,
            };
            match at {
                Some(i) => list[i] = entry,
                None => list.push(entry),
            }
        }
        (None, Some(i)) => {
            list.remove(i);
        }
        (None, None) => {}
    }
    Ok(())
}

/// The rows to store for the objects of one kind that differ between `before` and `after`.
fn changed_rows<T: Keyed + PartialEq + serde::Serialize>(
    kind: AdminKind,
    before: &[Sourced<T>],
    after: &mut [Sourced<T>],
) -> Vec<AssocRow> {
    let mut rows = Vec::new();
    for e in after.iter_mut() {
        let key = e.def.key();
        if before.iter().any(|b| b.def.key() == key && b.def == e.def) {
            continue;
        }
        e.source = Source::Database;
        rows.push(AssocRow {
            kind,
            key,
            record: serde_json::to_string(&e.def).ok(),
        });
    }
    for b in before {
        let key = b.def.key();
        if !after.iter().any(|e| e.def.key() == key) {
            rows.push(AssocRow {
                kind,
                key,
                record: None,
            });
        }
    }
    rows
}

impl Registry {
    /// The config file's associations with the database's rows over them. Rows that no
    /// longer fit the file (a user of an account the file and database no longer have, a
    /// parent or preempted QoS gone) are set aside with a warning rather than stopping the
    /// controller.
    pub fn load(base: Config, rows: &[AssocRow]) -> Result<Registry, serde_json::Error> {
        let mut r = Registry::from_config(base);
        for row in rows {
            let (key, rec) = (row.key.as_str(), row.record.as_deref());
            match row.kind {
                AdminKind::Account => put(&mut r.assocs.accounts, key, rec)?,
                AdminKind::User => put(&mut r.assocs.users, key, rec)?,
                AdminKind::Qos => put(&mut r.assocs.qos, key, rec)?,
                AdminKind::Partition => put(&mut r.assocs.partitions, key, rec)?,
                // Never stored as an association (drains are audited only).
                AdminKind::Node => {}
            }
        }
        r.repair();
        Ok(r)
    }

    /// Drops what no longer fits after a merge, with a warning each.
    fn repair(&mut self) {
        let a = &mut self.assocs;
        let names: Vec<String> = a.accounts.iter().map(|e| e.def.name.clone()).collect();
        for e in &mut a.accounts {
            if let Some(p) = e
                .def
                .parent
                .as_deref()
                .filter(|p| !names.iter().any(|n| n == p))
            {
                tracing::warn!(account = %e.def.name, parent = p, "the account's parent no longer exists; it now hangs under the root");
                e.def.parent = None;
            }
        }
        a.users.retain(|e| {
            let keep = names.contains(&e.def.account);
            if !keep {
                tracing::warn!(user = %e.def.user, account = %e.def.account, "dropping a user association whose account no longer exists");
            }
            keep
        });
        let qos: Vec<String> = a.qos.iter().map(|e| e.def.name.clone()).collect();
        for e in &mut a.qos {
            e.def.preempt.retain(|p| qos.contains(p));
        }
        for list in (a.accounts.iter_mut().map(|e| &mut e.def.limits.qos))
            .chain(a.users.iter_mut().map(|e| &mut e.def.limits.qos))
            .flatten()
        {
            list.retain(|q| qos.contains(q));
        }
        self.normalize();
        if let Err(problem) = self.validate() {
            tracing::warn!(%problem, "the associations of the config file and the database disagree; fix it with `wharf admin`");
        }
        for e in &self.assocs.qos {
            if let Some(path) = preempt_cycle(&self.assocs, &e.def.name) {
                let cycle = path.join(" preempts ");
                tracing::warn!(qos = %e.def.name, %cycle, "QoS preempt lists make a cycle; the scheduler ignores preemption between its QoS; fix it with `wharf admin qos modify`");
            }
        }
    }

    /// Gives every user with associations exactly one default (the first, when none is
    /// marked), and the partitions at most one.
    fn normalize(&mut self) {
        let users = &mut self.assocs.users;
        for i in 0..users.len() {
            let user = users[i].def.user.clone();
            let first_default = users
                .iter()
                .position(|e| e.def.user == user && e.def.default);
            let first = users.iter().position(|e| e.def.user == user);
            let keep = first_default.or(first);
            for (j, e) in users.iter_mut().enumerate() {
                if e.def.user == user {
                    e.def.default = Some(j) == keep;
                }
            }
        }
    }

    /// The associations, for `wharf admin show`.
    pub fn associations(&self) -> &Associations {
        &self.assocs
    }

    /// The account `name` and its ancestors, nearest first.
    pub fn lineage(&self, name: &str) -> Vec<&AccountDef> {
        let mut out: Vec<&AccountDef> = Vec::new();
        let mut at = Some(name);
        while let Some(n) = at {
            let Some(a) = self.account(n) else { break };
            if out.iter().any(|o| o.name == a.name) {
                break;
            }
            out.push(a);
            at = a.parent.as_deref();
        }
        out
    }

    /// The account `name`.
    pub fn account(&self, name: &str) -> Option<&AccountDef> {
        self.assocs
            .accounts
            .iter()
            .find(|e| e.def.name == name)
            .map(|e| &e.def)
    }

    /// The QoS jobs get when they name none.
    pub fn default_qos(&self) -> Option<&str> {
        self.base.limits.default_qos.as_deref()
    }

    /// Checks the whole set: names, shares, parents (known, no cycle), users' accounts and
    /// defaults, preempt lists, one default partition. The error names the problem.
    pub fn validate(&self) -> Result<(), String> {
        let a = &self.assocs;
        let bad_name = |what: &str, n: &str| {
            format!("{what} {n:?}: a name is 1 to 64 letters, digits, '-', '_' or '.'")
        };
        for e in &a.accounts {
            let d = &e.def;
            if !is_name(&d.name) {
                return Err(bad_name("account", &d.name));
            }
            if d.shares == 0 {
                return Err(format!("account {}: shares must be at least 1", d.name));
            }
            if let Some(c) = d.coordinators.iter().find(|c| !is_name(c)) {
                return Err(bad_name("coordinator", c));
            }
            if let Some(p) = &d.parent {
                if self.account(p).is_none() {
                    return Err(format!(
                        "account {}: parent {p:?} is not an account; add it first",
                        d.name
                    ));
                }
                let line = self.lineage(&d.name);
                let end = line.last().map(|l| l.parent.is_some()).unwrap_or(false);
                if end || line.iter().skip(1).any(|l| l.name == d.name) {
                    return Err(format!(
                        "account {}: parent {p:?} would make a cycle ({} is below {})",
                        d.name, p, d.name
                    ));
                }
            }
        }
        for e in &a.users {
            let d = &e.def;
            if !is_name(&d.user) {
                return Err(bad_name("user", &d.user));
            }
            if self.account(&d.account).is_none() {
                return Err(format!(
                    "user {}: account {:?} is not an account; add it first",
                    d.user, d.account
                ));
            }
            if d.shares == 0 {
                return Err(format!(
                    "user {} in {}: shares must be at least 1",
                    d.user, d.account
                ));
            }
        }
        let lists = (a.accounts.iter())
            .map(|e| (format!("account {}", e.def.name), &e.def.limits.qos))
            .chain(a.users.iter().map(|e| {
                let d = &e.def;
                (format!("user {} in {}", d.user, d.account), &d.limits.qos)
            }));
        for (who, list) in lists {
            if let Some(q) =
                (list.iter().flatten()).find(|q| !a.qos.iter().any(|e| &e.def.name == *q))
            {
                return Err(format!("{who}: qos names {q:?}, which is not a QoS"));
            }
        }
        for e in &a.qos {
            let d = &e.def;
            if !is_name(&d.name) {
                return Err(bad_name("qos", &d.name));
            }
            if let Some(p) = d
                .preempt
                .iter()
                .find(|p| !a.qos.iter().any(|q| &q.def.name == *p))
            {
                return Err(format!(
                    "qos {}: preempt names {p:?}, which is not a QoS",
                    d.name
                ));
            }
        }
        for e in &a.partitions {
            if !is_name(&e.def.name) {
                return Err(bad_name("partition", &e.def.name));
            }
            if let Some(n) = e.def.nodes.iter().find(|n| !is_name(n)) {
                return Err(bad_name("node", n));
            }
        }
        if let Some(q) = self.default_qos() {
            if !a.qos.iter().any(|e| e.def.name == q) {
                return Err(format!(
                    "qos {q} is the default QoS ([scheduler] default_qos); it must stay"
                ));
            }
        }
        Ok(())
    }

    /// Applies `change` and checks the result. Returns the object's definition before and
    /// after (as JSON, for the audit) and the rows to store: the object's, and those of
    /// others the change touched (a user's former default, the former default partition).
    pub fn apply(&mut self, change: &AdminChange) -> Result<Applied, String> {
        let before = self.assocs.clone();
        let name = change.name.trim();
        let (old, new) = match change.kind {
            AdminKind::Node => {
                return Err(format!(
                    "node {name}: nodes are drained and resumed with `wharf nodes --drain NODE \
                     --reason TEXT` and `--resume NODE`"
                ))
            }
            AdminKind::Account => {
                let blank = AccountDef::new(name);
                edit(
                    &mut self.assocs.accounts,
                    "account",
                    name,
                    change,
                    blank,
                    settings::account,
                )?
            }
            AdminKind::User => {
                let account = change
                    .account
                    .as_deref()
                    .map(str::trim)
                    .ok_or_else(|| format!("user {name}: name the account with --account"))?;
                let key = user_key(name, account);
                let first = !self.assocs.users.iter().any(|e| e.def.user == name);
                let blank = UserDef {
                    user: name.into(),
                    account: account.into(),
                    shares: 1,
                    default: first,
                    limits: AssocCaps::default(),
                };
                let mut change = change.clone();
                change.name = key;
                let out = edit(
                    &mut self.assocs.users,
                    "user",
                    name,
                    &change,
                    blank,
                    settings::user,
                )?;
                // A new default unmarks the user's others.
                if marks_default(&change.settings) {
                    for e in &mut self.assocs.users {
                        if e.def.user == name && e.def.account != account {
                            e.def.default = false;
                        }
                    }
                }
                out
            }
            AdminKind::Qos => {
                let blank = QosDef::new(name);
                let out = edit(
                    &mut self.assocs.qos,
                    "qos",
                    name,
                    change,
                    blank,
                    settings::qos,
                )?;
                if change.action == AdminAction::Remove {
                    if let Some(q) = before
                        .qos
                        .iter()
                        .find(|q| q.def.preempt.iter().any(|p| p == name))
                    {
                        return Err(format!(
                            "qos {name} is in qos {}'s preempt list; take it out first",
                            q.def.name
                        ));
                    }
                    let granted = (before.accounts.iter())
                        .filter(|e| e.def.limits.qos.iter().flatten().any(|q| q == name))
                        .map(|e| format!("account {}", e.def.name))
                        .chain(
                            (before.users.iter())
                                .filter(|e| e.def.limits.qos.iter().flatten().any(|q| q == name))
                                .map(|e| format!("user {} in {}", e.def.user, e.def.account)),
                        )
                        .next();
                    if let Some(who) = granted {
                        return Err(format!(
                            "qos {name} is in {who}'s qos list; take it out first (--qos with \
                             the others, or none)"
                        ));
                    }
                }
                out
            }
            AdminKind::Partition => {
                let blank = PartitionDef::new(name);
                let out = edit(
                    &mut self.assocs.partitions,
                    "partition",
                    name,
                    change,
                    blank,
                    settings::partition,
                )?;
                if marks_default(&change.settings) {
                    for e in &mut self.assocs.partitions {
                        e.def.default = e.def.name == name;
                    }
                }
                out
            }
        };
        if change.action == AdminAction::Remove && change.kind == AdminKind::Account {
            if let Some(c) = before
                .accounts
                .iter()
                .find(|e| e.def.parent.as_deref() == Some(name))
            {
                return Err(format!(
                    "account {name} has child account {}; remove or move it first",
                    c.def.name
                ));
            }
            let users: Vec<&str> = before
                .users
                .iter()
                .filter(|e| e.def.account == name)
                .map(|e| e.def.user.as_str())
                .collect();
            if !users.is_empty() {
                return Err(format!(
                    "account {name} still has users ({}); remove them first with `wharf admin user rm USER --account {name}`",
                    users.join(", ")
                ));
            }
        }
        self.normalize();
        self.validate()?;
        // A cycle of preempt lists this change makes is refused. One already there (kept
        // from before such lists were checked) is left to the scheduler, which ignores it,
        // rather than refusing every other change until an admin finds it.
        for e in &self.assocs.qos {
            let q = e.def.name.as_str();
            if let Some(path) = preempt_cycle(&self.assocs, q) {
                if preempt_cycle(&before, q).is_none() {
                    return Err(format!(
                        "qos {q}: preempt would make a cycle ({}): their jobs would preempt \
                         each other without end; a QoS preempts only QoS that cannot preempt \
                         it back",
                        path.join(" preempts ")
                    ));
                }
            }
        }
        let mut rows = changed_rows(
            AdminKind::Account,
            &before.accounts,
            &mut self.assocs.accounts,
        );
        rows.extend(changed_rows(
            AdminKind::User,
            &before.users,
            &mut self.assocs.users,
        ));
        rows.extend(changed_rows(
            AdminKind::Qos,
            &before.qos,
            &mut self.assocs.qos,
        ));
        rows.extend(changed_rows(
            AdminKind::Partition,
            &before.partitions,
            &mut self.assocs.partitions,
        ));
        Ok((old, new, rows))
    }
}

/// True when the settings make the object a default (`default = true`).
fn marks_default(settings: &std::collections::BTreeMap<String, String>) -> bool {
    settings
        .get("default")
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("yes"))
}

/// An object's definition before and after a change, as JSON.
type Edited = (Option<serde_json::Value>, Option<serde_json::Value>);

/// What [`Registry::apply`] returns: the object's definition before and after, and the rows
/// to store.
pub type Applied = (
    Option<serde_json::Value>,
    Option<serde_json::Value>,
    Vec<AssocRow>,
);

/// Adds, modifies or removes the object `change.name` (its store key) of one kind in `list`,
/// setting each of the change's settings with `set`. `label` is what errors call it.
fn edit<T: Keyed + Clone + serde::Serialize>(
    list: &mut Vec<Sourced<T>>,
    kind: &str,
    label: &str,
    change: &AdminChange,
    blank: T,
    set: fn(&mut T, &str, &str) -> Result<(), String>,
) -> Result<Edited, String> {
    let key = if change.kind == AdminKind::User {
        change.name.clone()
    } else {
        if !is_name(label) {
            return Err(format!(
                "{kind} {label:?}: a name is 1 to 64 letters, digits, '-', '_' or '.'"
            ));
        }
        blank.key()
    };
    let what = match (change.kind, change.account.as_deref()) {
        (AdminKind::User, Some(a)) => format!("user {label} in account {a}"),
        _ => format!("{kind} {label}"),
    };
    let at = list.iter().position(|e| e.def.key() == key);
    let json = |d: &T| serde_json::to_value(d).ok();
    match (change.action, at) {
        (AdminAction::Add, Some(_)) => Err(format!("{what} exists; change it with `modify`")),
        (AdminAction::Add, None) => {
            let mut def = blank;
            for (k, v) in &change.settings {
                set(&mut def, k, v)?;
            }
            let new = json(&def);
            list.push(Sourced {
                def,
                source: Source::Database,
            });
            Ok((None, new))
        }
        (_, None) => Err(match change.kind {
            AdminKind::User => format!(
                "{what}: no such association; add it with `wharf admin user add {label} --account {}`",
                change.account.as_deref().unwrap_or("ACCOUNT")
            ),
            _ => format!("{what} does not exist"),
        }),
        (AdminAction::Modify, Some(i)) => {
            if change.settings.is_empty() {
                return Err(format!("{what}: nothing to change; give a setting"));
            }
            let old = json(&list[i].def);
            let mut def = list[i].def.clone();
            for (k, v) in &change.settings {
                set(&mut def, k, v)?;
            }
            list[i].def = def;
            Ok((old, json(&list[i].def)))
        }
        (AdminAction::Remove, Some(i)) => {
            let old = json(&list[i].def);
            list.remove(i);
            Ok((old, None))
        }
    }
}

/// A path of `preempt` lists from `qos` back to itself (`[qos, .., qos]`), if one exists:
/// the shortest, found breadth first.
fn preempt_cycle(a: &Associations, qos: &str) -> Option<Vec<String>> {
    let lists = |q: &str| {
        (a.qos.iter())
            .find(|e| e.def.name == q)
            .map_or(&[][..], |e| e.def.preempt.as_slice())
    };
    let mut from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([qos]);
    while let Some(q) = queue.pop_front() {
        for next in lists(q) {
            if next == qos {
                // `q` back to `qos` through the steps that found it, then round to `qos`.
                let mut path = vec![q.to_string()];
                let mut at = q;
                while at != qos {
                    at = from[at];
                    path.push(at.to_string());
                }
                path.reverse();
                path.push(qos.to_string());
                return Some(path);
            }
            if !from.contains_key(next.as_str()) {
                from.insert(next, q);
                queue.push_back(next);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
