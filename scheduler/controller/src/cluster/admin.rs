//! `wharf admin` on the cluster: who may change associations, what a removal must wait for,
//! and the change itself, stored with its audit before the scheduler's config is replaced
//! (the next pass uses it).

use wharf_api::admin::{AdminAction, AdminChange, AdminKind, Associations, AuditEntry};
use wharf_api::wire::ErrorKind;
use wharf_api::JobId;

use super::{Caller, Cluster, Failure};
use crate::admin::user_key;

impl Cluster {
    /// Makes `change` as `caller`, or refuses it and changes nothing. Returns its audit entry.
    pub fn admin_change(
        &mut self,
        caller: &Caller,
        change: &AdminChange,
        now: u64,
    ) -> Result<AuditEntry, Failure> {
        self.authorize(caller, change)?;
        let mut next = self.assocs.clone();
        let (old, new, rows) = next
            .apply(change)
            .map_err(|m| Failure::new(ErrorKind::InvalidInput, m))?;
        if change.action == AdminAction::Remove {
            self.check_unused(change)?;
        }
        let name = match (change.kind, change.account.as_deref()) {
            (AdminKind::User, Some(a)) => user_key(change.name.trim(), a.trim()),
            _ => change.name.trim().to_string(),
        };
        let mut entry = AuditEntry {
            id: 0,
            time: now,
            uid: caller.owner.uid,
            user: caller.owner.user.clone(),
            command: command_line(change),
            kind: change.kind,
            name,
            old,
            new,
        };
        entry.id = self.store.change_associations(&rows, &entry)?;
        self.sched = next.config();
        self.assocs = next;
        Ok(entry)
    }

    /// Every account, user association, QoS and partition, with its source. Anyone may read
    /// them (as `sacctmgr show` in Slurm): job reasons name accounts and limits already.
    pub fn associations(&self) -> Associations {
        self.assocs.associations().clone()
    }

    /// The accounting ledger's engine and how many runs its database refused for good (set
    /// aside in the dead letters). Anyone may read it.
    pub fn ledger_status(&self) -> Result<wharf_api::admin::LedgerStatus, Failure> {
        let dead = self
            .ledger
            .dead_letters()
            .map_err(|e| Failure::new(e.kind(), e.to_string()))?;
        Ok(wharf_api::admin::LedgerStatus {
            engine: self.engine.clone(),
            dead_letters: dead as u64,
        })
    }

    /// Audited changes since `since` (ms), oldest first; admins only.
    pub fn audit(
        &self,
        caller: &Caller,
        since: u64,
        limit: u32,
    ) -> Result<Vec<AuditEntry>, Failure> {
        if !caller.admin {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                "only an admin (root or a user in [controller] admins) may read the audit",
            ));
        }
        Ok(self.store.audit(since, limit)?)
    }

    /// Admins may change anything; an account's coordinator (of it or of an account above it)
    /// may add, modify and remove that account's users, nothing else. Not a user's default
    /// account: that moves where the user's jobs are charged away from accounts the
    /// coordinator may not manage.
    fn authorize(&self, caller: &Caller, change: &AdminChange) -> Result<(), Failure> {
        if caller.admin {
            return Ok(());
        }
        let who = caller.owner.user.as_str();
        if change.kind == AdminKind::User && change.settings.contains_key("default") {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                format!(
                    "only an admin (root or a user in [controller] admins) may set user {}'s \
                     default account: it decides where their jobs are charged in every account; \
                     a user added to their first account gets it as default by themselves",
                    change.name.trim()
                ),
            ));
        }
        if change.kind == AdminKind::User && change.settings.contains_key("qos") {
            return Err(Failure::new(
                ErrorKind::PermissionDenied,
                format!(
                    "only an admin (root or a user in [controller] admins) may set which QoS \
                     user {} may use: a QoS may preempt other accounts' jobs",
                    change.name.trim()
                ),
            ));
        }
        if let (AdminKind::User, Some(account)) = (change.kind, change.account.as_deref()) {
            let coordinates = self
                .assocs
                .lineage(account.trim())
                .iter()
                .any(|a| a.coordinators.iter().any(|c| c == who));
            if coordinates {
                return Ok(());
            }
        }
        let mine: Vec<&str> = self
            .assocs
            .associations()
            .accounts
            .iter()
            .filter(|e| e.def.coordinators.iter().any(|c| c == who))
            .map(|e| e.def.name.as_str())
            .collect();
        let what = match (change.kind, change.account.as_deref()) {
            (AdminKind::User, Some(a)) => format!("users of account {a}"),
            (AdminKind::Account, _) => "accounts".into(),
            (AdminKind::User, None) => "users".into(),
            (AdminKind::Qos, _) => "QoS".into(),
            (AdminKind::Partition, _) => "partitions".into(),
            (AdminKind::Node, _) => "nodes".into(),
        };
        let also = if mine.is_empty() {
            String::new()
        } else {
            format!(
                "; as coordinator of {} you may add, modify and remove the users of those \
                 accounts and their sub-accounts",
                mine.join(", ")
            )
        };
        Err(Failure::new(
            ErrorKind::PermissionDenied,
            format!(
                "only an admin (root or a user in [controller] admins){} may {} {what}{also}",
                if change.kind == AdminKind::User {
                    " or the account's coordinator"
                } else {
                    ""
                },
                change.action.as_str().replace("rm", "remove"),
            ),
        ))
    }

    /// Refuses to remove what pending or running jobs use.
    fn check_unused(&self, change: &AdminChange) -> Result<(), Failure> {
        let name = change.name.trim();
        let default_partition = self.sched.default_partition_name();
        let using: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| match change.kind {
                AdminKind::Account => self.assoc(j).account == name,
                AdminKind::User => {
                    let a = self.assoc(j);
                    a.user == name && change.account.as_deref().map(str::trim) == Some(&a.account)
                }
                AdminKind::Qos => self.qos_of(j.spec.as_ref()).as_deref() == Some(name),
                AdminKind::Partition => {
                    super::sched::partition(j)
                        .as_deref()
                        .unwrap_or(default_partition)
                        == name
                }
                AdminKind::Node => false,
            })
            .map(|j| j.id)
            .collect();
        if using.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = using.iter().take(10).map(|i| i.to_string()).collect();
        let what = match (change.kind, change.account.as_deref()) {
            (AdminKind::User, Some(a)) => format!("user {name} in account {a}"),
            (kind, _) => format!("{} {name}", kind.as_str()),
        };
        Err(Failure::new(
            ErrorKind::Conflict,
            format!(
                "{what} has {} pending or running jobs (ids {}{}); wait for them to end or \
                 cancel them first",
                using.len(),
                ids.join(", "),
                if using.len() > ids.len() { ", ..." } else { "" }
            ),
        ))
    }
}

/// The change as a command line, for the audit.
fn command_line(change: &AdminChange) -> String {
    let mut out = format!(
        "{} {} {}",
        change.kind.as_str(),
        change.action.as_str(),
        change.name.trim()
    );
    if let Some(a) = &change.account {
        out.push_str(&format!(" account={}", a.trim()));
    }
    for (k, v) in &change.settings {
        out.push_str(&format!(" {k}={v}"));
    }
    out
}
