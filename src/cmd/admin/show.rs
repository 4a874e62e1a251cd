//! `wharf admin ... show` and `wharf admin audit`: the associations as tables (accounts as a
//! tree) or JSON, and the audit with each change's old and new values.

use std::collections::BTreeMap;

use anyhow::Result;
use serde_json::Value;
use wharf_api::admin::{AccountDef, AdminKind, AssocCaps, Associations, AuditList, TresCaps};
use wharf_api::resources::{format_duration, format_memory, parse_duration};
use wharf_client::Client;

use crate::output;

/// Arguments of `show`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShowArgs {
    /// Only this one (an account: with what is below it).
    name: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of `audit`.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Only changes since: a duration back from now (2h, 7d) or a UTC date or time
    /// (2026-05-01, 2026-05-01T08:00).
    #[arg(long, value_name = "T")]
    since: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

fn tres(t: &TresCaps) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = t.cpu {
        out.push(format!("cpu={c}"));
    }
    if let Some(g) = t.gpu {
        out.push(format!("gpu={g}"));
    }
    if let Some(m) = t.mem {
        out.push(format!("mem={}", format_memory(m)));
    }
    out
}

/// Limits as `key=value` words, `-` for none.
fn limits(pairs: &[(&str, Vec<String>)]) -> String {
    let words: Vec<String> = pairs
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", v.join(",")))
        .collect();
    if words.is_empty() {
        "-".into()
    } else {
        words.join(" ")
    }
}

fn count(n: Option<u64>) -> Vec<String> {
    n.map(|n| vec![n.to_string()]).unwrap_or_default()
}

fn assoc_limits(c: &AssocCaps) -> String {
    limits(&[
        ("grp_tres", tres(&c.grp_tres)),
        ("grp_jobs", count(c.grp_jobs)),
        ("max_jobs", count(c.max_jobs)),
        ("max_submit_jobs", count(c.max_submit_jobs)),
        ("max_tres_per_job", tres(&c.max_tres_per_job)),
        ("grp_tres_mins", tres_mins(&c.grp_tres_mins)),
        // An empty list (the default QoS only, whatever the parent allows) shows as `qos=-`.
        (
            "qos",
            (c.qos.as_ref())
                .map(|l| {
                    if l.is_empty() {
                        vec!["-".into()]
                    } else {
                        l.clone()
                    }
                })
                .unwrap_or_default(),
        ),
    ])
}

/// A budget as `gpu=6000,billing=100000` words (TRES-minutes).
fn tres_mins(t: &wharf_api::admin::TresMinsCaps) -> Vec<String> {
    [("cpu", t.cpu), ("gpu", t.gpu), ("billing", t.billing)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect()
}

fn time(secs: Option<u64>) -> String {
    secs.map(format_duration).unwrap_or_else(|| "-".into())
}

fn list_or_dash(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(",")
    }
}

/// Accounts in tree order (each followed by its children), depth with each.
fn tree<'a>(a: &'a Associations, root: Option<&str>) -> Vec<(usize, &'a AccountDef, &'a str)> {
    fn walk<'a>(
        a: &'a Associations,
        parent: Option<&str>,
        depth: usize,
        out: &mut Vec<(usize, &'a AccountDef, &'a str)>,
    ) {
        for e in a
            .accounts
            .iter()
            .filter(|e| e.def.parent.as_deref() == parent)
        {
            if out.iter().any(|(_, d, _)| d.name == e.def.name) {
                continue;
            }
            out.push((depth, &e.def, e.source.as_str()));
            walk(a, Some(&e.def.name), depth + 1, out);
        }
    }
    let mut out = Vec::new();
    match root.and_then(|r| a.accounts.iter().find(|e| e.def.name == r)) {
        Some(e) => {
            out.push((0, &e.def, e.source.as_str()));
            walk(a, Some(&e.def.name), 1, &mut out);
        }
        None => walk(a, None, 0, &mut out),
    }
    out
}

/// Runs `show` for one kind.
pub async fn show(client: &Client, kind: AdminKind, args: ShowArgs) -> Result<i32> {
    let a: Associations = client.get("/v1/admin/associations").await?;
    let name = args.name.as_deref();
    let wanted = |n: &str| name.is_none_or(|w| w == n);
    if let Some(n) = name {
        let found = match kind {
            AdminKind::Account => a.accounts.iter().any(|e| e.def.name == n),
            AdminKind::User => a.users.iter().any(|e| e.def.user == n),
            AdminKind::Qos => a.qos.iter().any(|e| e.def.name == n),
            AdminKind::Partition => a.partitions.iter().any(|e| e.def.name == n),
            AdminKind::Node => false,
        };
        if !found {
            let what = kind.as_str();
            anyhow::bail!(
                "no {what} {}; `wharf admin {what} show` lists them",
                output::clean(n)
            );
        }
    }
    if args.json {
        let value = match kind {
            AdminKind::Account => {
                let keep: Vec<&str> = tree(&a, name)
                    .iter()
                    .map(|(_, d, _)| d.name.as_str())
                    .collect();
                serde_json::to_value(
                    a.accounts
                        .iter()
                        .filter(|e| keep.contains(&e.def.name.as_str()))
                        .collect::<Vec<_>>(),
                )?
            }
            AdminKind::User => serde_json::to_value(
                a.users
                    .iter()
                    .filter(|e| wanted(&e.def.user))
                    .collect::<Vec<_>>(),
            )?,
            AdminKind::Qos => serde_json::to_value(
                a.qos
                    .iter()
                    .filter(|e| wanted(&e.def.name))
                    .collect::<Vec<_>>(),
            )?,
            AdminKind::Partition => serde_json::to_value(
                a.partitions
                    .iter()
                    .filter(|e| wanted(&e.def.name))
                    .collect::<Vec<_>>(),
            )?,
            AdminKind::Node => serde_json::Value::Null,
        };
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(0);
    }
    let t = match kind {
        AdminKind::Account => {
            let mut t = output::table(&[
                "ACCOUNT",
                "SHARES",
                "LIMITS",
                "COORDINATORS",
                "USERS",
                "SOURCE",
            ]);
            for (depth, d, source) in tree(&a, name) {
                let users: Vec<String> = a
                    .users
                    .iter()
                    .filter(|u| u.def.account == d.name)
                    .map(|u| u.def.user.clone())
                    .collect();
                t.add_row([
                    format!("{}{}", "  ".repeat(depth), d.name),
                    d.shares.to_string(),
                    assoc_limits(&d.limits),
                    list_or_dash(&d.coordinators),
                    list_or_dash(&users),
                    source.to_string(),
                ]);
            }
            t
        }
        AdminKind::User => {
            let mut t =
                output::table(&["USER", "ACCOUNT", "DEFAULT", "SHARES", "LIMITS", "SOURCE"]);
            for e in a.users.iter().filter(|e| wanted(&e.def.user)) {
                let d = &e.def;
                t.add_row([
                    d.user.clone(),
                    d.account.clone(),
                    if d.default { "yes" } else { "no" }.into(),
                    d.shares.to_string(),
                    assoc_limits(&d.limits),
                    e.source.as_str().into(),
                ]);
            }
            t
        }
        AdminKind::Qos => {
            let mut t = output::table(&["QOS", "PRIORITY", "LIMITS", "PREEMPT", "SOURCE"]);
            for e in a.qos.iter().filter(|e| wanted(&e.def.name)) {
                let d = &e.def;
                let lim = limits(&[
                    ("max_tres_per_user", tres(&d.max_tres_per_user)),
                    ("max_jobs_per_user", count(d.max_jobs_per_user)),
                    (
                        "max_submit_jobs_per_user",
                        count(d.max_submit_jobs_per_user),
                    ),
                    (
                        "max_wall",
                        d.max_wall
                            .map(|s| vec![format_duration(s)])
                            .unwrap_or_default(),
                    ),
                    ("grp_tres", tres(&d.grp_tres)),
                    ("grp_jobs", count(d.grp_jobs)),
                ]);
                t.add_row([
                    d.name.clone(),
                    d.priority.to_string(),
                    lim,
                    list_or_dash(&d.preempt),
                    e.source.as_str().into(),
                ]);
            }
            t
        }
        AdminKind::Partition => {
            let mut t = output::table(&[
                "PARTITION",
                "STATE",
                "DEFAULT",
                "TIER",
                "MAX_TIME",
                "DEFAULT_TIME",
                "MAX_NODES",
                "MEM/CPU",
                "MEM/GPU",
                "NODES",
                "SOURCE",
            ]);
            // Memory per CPU or GPU as DEFAULT/MAX, `-` for none.
            let per = |def: Option<u64>, max: Option<u64>| match (def, max) {
                (None, None) => "-".to_string(),
                (d, m) => {
                    let f = |v: Option<u64>| v.map_or("-".into(), format_memory);
                    format!("{}/{}", f(d), f(m))
                }
            };
            for e in a.partitions.iter().filter(|e| wanted(&e.def.name)) {
                let d = &e.def;
                t.add_row([
                    d.name.clone(),
                    d.state.clone(),
                    if d.default { "yes" } else { "no" }.into(),
                    d.priority_tier.to_string(),
                    time(d.max_time),
                    time(d.default_time),
                    d.max_nodes.map_or("-".into(), |n| n.to_string()),
                    per(d.def_mem_per_cpu, d.max_mem_per_cpu),
                    per(d.def_mem_per_gpu, d.max_mem_per_gpu),
                    if d.nodes.is_empty() {
                        "all".into()
                    } else {
                        d.nodes.join(",")
                    },
                    e.source.as_str().into(),
                ]);
            }
            t
        }
        AdminKind::Node => output::table(&["NODE"]),
    };
    output::print_table(&t);
    Ok(0)
}

/// The `--since` time as ms since the epoch.
fn since(text: &str) -> Result<u64> {
    let now = wharf_controller::now_ms();
    if let Ok(secs) = parse_duration(text) {
        return Ok(now.saturating_sub(secs.saturating_mul(1000)));
    }
    match wharf_api::forms::parse_begin(text).map(crate::localtime::localize) {
        Ok(Ok(b)) => Ok(b.at(now)),
        Ok(Err(e)) => Err(e.context(format!("--since {text:?}"))),
        Err(_) => anyhow::bail!(
            "--since {text:?}: write a duration back from now (2h, 7d) or a date or time in \
             your time zone (2026-05-01, 2026-05-01T08:00) or UTC (2026-05-01T08:00Z)"
        ),
    }
}

/// Runs `audit`.
/// `wharf admin ledger`.
pub async fn ledger(client: &Client, json: bool) -> Result<i32> {
    let l: wharf_api::admin::LedgerStatus = client.get("/v1/admin/ledger").await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&l)?);
        return Ok(0);
    }
    println!("engine: {}", l.engine);
    if l.dead_letters == 0 {
        println!("dead letters: 0");
    } else {
        println!(
            "dead letters: {} (runs the database refused for good, kept with the error in \
             <state_dir>/ledger.deadletter; fix and insert them by hand, then remove the file)",
            l.dead_letters
        );
    }
    Ok(0)
}

pub async fn audit(client: &Client, args: AuditArgs) -> Result<i32> {
    let from = args.since.as_deref().map(since).transpose()?.unwrap_or(0);
    let list: AuditList = match client.get(&format!("/v1/admin/audit?since={from}")).await {
        Ok(l) => l,
        Err(wharf_client::ClientError::Api { error, .. }) => {
            eprintln!("error: {}", output::clean(&error.error));
            return Ok(1);
        }
        Err(e) => return Err(e.into()),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(0);
    }
    let mut t = output::table(&["ID", "TIME", "WHO", "COMMAND", "CHANGES"]);
    for e in &list.entries {
        t.add_row([
            e.id.to_string(),
            output::time(Some(e.time)),
            format!("{} ({})", e.user, e.uid),
            e.command.clone(),
            diff(e.old.as_ref(), e.new.as_ref()).join("; "),
        ]);
    }
    output::print_table(&t);
    Ok(0)
}

/// Leaves of a JSON object as `a.b` → value text.
fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Null => {}
        Value::Array(a) if a.is_empty() => {}
        Value::String(s) => {
            out.insert(prefix.into(), s.clone());
        }
        other => {
            out.insert(prefix.into(), other.to_string());
        }
    }
}

/// What changed between two definitions, one `key: old -> new` per setting (`-`: unset).
pub fn diff(old: Option<&Value>, new: Option<&Value>) -> Vec<String> {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    if let Some(o) = old {
        flatten("", o, &mut a);
    }
    if let Some(n) = new {
        flatten("", n, &mut b);
    }
    if new.is_none() {
        return vec!["removed".into()];
    }
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let dash = || "-".to_string();
            format!(
                "{k}: {} -> {}",
                a.get(k).cloned().unwrap_or_else(dash),
                b.get(k).cloned().unwrap_or_else(dash)
            )
        })
        .collect()
}
