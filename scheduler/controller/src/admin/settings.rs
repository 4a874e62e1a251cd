//! `key = value` settings of `wharf admin` changes, parsed into definitions. Every error names
//! the key and what it accepts; `none` clears an optional value.

use wharf_api::admin::{
    AccountDef, AssocCaps, PartitionDef, QosDef, TresCaps, TresMinsCaps, UserDef,
};
use wharf_api::job::is_name;
use wharf_api::resources::{parse_duration, parse_memory};

/// The settings of a user association; an account's coordinator may change all of them but
/// `default` and `qos` (see `Cluster::authorize`).
pub const USER_KEYS: &[&str] = &[
    "shares",
    "default",
    "qos",
    "grp_tres",
    "grp_jobs",
    "max_jobs",
    "max_submit_jobs",
    "max_tres_per_job",
    "grp_tres_mins",
];

const ACCOUNT_KEYS: &[&str] = &[
    "parent",
    "shares",
    "coordinators",
    "grp_tres",
    "grp_jobs",
    "max_jobs",
    "max_submit_jobs",
    "max_tres_per_job",
    "grp_tres_mins",
    "qos",
];

const QOS_KEYS: &[&str] = &[
    "priority",
    "max_tres_per_user",
    "max_jobs_per_user",
    "max_submit_jobs_per_user",
    "max_wall",
    "grp_tres",
    "grp_jobs",
    "preempt",
    "preempt_mode",
];

const PARTITION_KEYS: &[&str] = &[
    "nodes",
    "state",
    "priority_tier",
    "max_time",
    "default_time",
    "max_nodes",
    "def_mem_per_cpu",
    "def_mem_per_gpu",
    "max_mem_per_cpu",
    "max_mem_per_gpu",
    "billing_cpu",
    "billing_memory_gib",
    "billing_gpu",
    "default",
    "preempt_mode",
    "allow_accounts",
    "allow_groups",
];

fn unknown(kind: &str, key: &str, known: &[&str]) -> String {
    format!(
        "unknown {kind} setting {key:?}; the settings are: {}",
        known.join(", ")
    )
}

fn is_none(value: &str) -> bool {
    value.eq_ignore_ascii_case("none")
}

/// A count, or `none`.
fn count(key: &str, value: &str) -> Result<Option<u64>, String> {
    if is_none(value) {
        return Ok(None);
    }
    value
        .trim()
        .parse()
        .map(Some)
        .map_err(|_| format!("{key} {value:?}: write a whole number (0 or more) or none"))
}

/// Shares: a whole number of at least 1.
fn shares(value: &str) -> Result<u32, String> {
    match value.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "shares {value:?}: write a whole number of at least 1"
        )),
    }
}

fn boolean(key: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" => Ok(true),
        "false" | "no" => Ok(false),
        _ => Err(format!("{key} {value:?}: write true or false")),
    }
}

/// A duration in seconds, or `none`.
fn secs(key: &str, value: &str) -> Result<Option<u64>, String> {
    if is_none(value) {
        return Ok(None);
    }
    parse_duration(value)
        .map(Some)
        .map_err(|e| format!("{key}: {e}"))
}

/// A size (`4G`), or `none`.
fn size(key: &str, value: &str) -> Result<Option<u64>, String> {
    if is_none(value) {
        return Ok(None);
    }
    match parse_memory(value) {
        Ok(0) => Err(format!("{key} must be more than 0, or none")),
        Ok(n) => Ok(Some(n)),
        Err(e) => Err(format!("{key}: {e}")),
    }
}

/// A comma-separated list of names (empty: none).
fn names(key: &str, value: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    if is_none(value.trim()) {
        return Ok(out);
    }
    for n in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !is_name(n) {
            return Err(format!(
                "{key}: {n:?} is not a name (1 to 64 letters, digits, '-', '_' or '.')"
            ));
        }
        if !out.iter().any(|o| o == n) {
            out.push(n.to_string());
        }
    }
    Ok(out)
}

/// `cpu=64,gpu=16,mem=256G` into `caps`: the TRES named change, the others stay; `gpu=none`
/// clears one.
fn tres(caps: &mut TresCaps, key: &str, value: &str) -> Result<(), String> {
    if is_none(value) {
        *caps = TresCaps::default();
        return Ok(());
    }
    if value.split(',').all(|p| p.trim().is_empty()) {
        return Err(format!(
            "{key} {value:?}: write TRES=COUNT pairs, e.g. gpu=16,cpu=64,mem=256G (or none)"
        ));
    }
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || {
            format!("{key} {part:?}: write TRES=COUNT pairs, e.g. gpu=16,cpu=64,mem=256G (TRES=none clears one)")
        };
        let (name, v) = part.split_once('=').ok_or_else(bad)?;
        let v = v.trim();
        let slot = match name.trim() {
            "cpu" => &mut caps.cpu,
            "gpu" => &mut caps.gpu,
            "mem" => &mut caps.mem,
            other => {
                return Err(format!(
                    "{key}: unknown TRES {other:?}; use cpu, gpu or mem"
                ))
            }
        };
        *slot = if is_none(v) {
            None
        } else if name.trim() == "mem" {
            Some(parse_memory(v).map_err(|e| format!("{key} mem: {e}"))?)
        } else {
            Some(v.parse().map_err(|_| bad())?)
        };
    }
    Ok(())
}

/// `gpu=6000,billing=100000` (TRES-minutes) into `caps`: the TRES named change, the others
/// stay; `gpu=none` clears one, `none` all.
fn tres_mins(caps: &mut TresMinsCaps, key: &str, value: &str) -> Result<(), String> {
    if is_none(value) {
        *caps = TresMinsCaps::default();
        return Ok(());
    }
    let mut parts = value
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .peekable();
    if parts.peek().is_none() {
        return Err(format!(
            "{key} {value:?}: write TRES=MINUTES pairs, e.g. gpu=6000,billing=100000 (or none)"
        ));
    }
    let mut new = *caps;
    for part in parts {
        let bad = || {
            format!(
                "{key} {part:?}: write TRES=MINUTES pairs with a whole number of minutes \
                 (0 or more), e.g. gpu=6000,cpu=50000,billing=100000 (TRES=none clears one)"
            )
        };
        let (name, v) = part.split_once('=').ok_or_else(bad)?;
        let slot = match name.trim() {
            "cpu" => &mut new.cpu,
            "gpu" => &mut new.gpu,
            "billing" => &mut new.billing,
            other => {
                return Err(format!(
                    "{key}: unknown TRES {other:?}; budgets are kept for cpu, gpu and billing"
                ))
            }
        };
        let v = v.trim();
        *slot = if is_none(v) {
            None
        } else {
            Some(v.parse().map_err(|_| bad())?)
        };
    }
    *caps = new;
    Ok(())
}

/// The limits every association has; `Ok(false)` when `key` is not one of them.
fn assoc_caps(caps: &mut AssocCaps, key: &str, value: &str) -> Result<bool, String> {
    match key {
        "grp_tres" => tres(&mut caps.grp_tres, key, value)?,
        "max_tres_per_job" => tres(&mut caps.max_tres_per_job, key, value)?,
        "grp_jobs" => caps.grp_jobs = count(key, value)?,
        "max_jobs" => caps.max_jobs = count(key, value)?,
        "max_submit_jobs" => caps.max_submit_jobs = count(key, value)?,
        "grp_tres_mins" => tres_mins(&mut caps.grp_tres_mins, key, value)?,
        // `none`: the parent account's list again.
        "qos" if is_none(value.trim()) => caps.qos = None,
        "qos" => caps.qos = Some(names(key, value)?),
        _ => return Ok(false),
    }
    Ok(true)
}

/// Sets one setting of an account.
pub fn account(def: &mut AccountDef, key: &str, value: &str) -> Result<(), String> {
    match key {
        "parent" if is_none(value) => def.parent = None,
        "parent" => def.parent = Some(value.trim().to_string()),
        "shares" => def.shares = shares(value)?,
        "coordinators" => def.coordinators = names(key, value)?,
        _ if assoc_caps(&mut def.limits, key, value)? => {}
        _ => return Err(unknown("account", key, ACCOUNT_KEYS)),
    }
    Ok(())
}

/// Sets one setting of a user association.
pub fn user(def: &mut UserDef, key: &str, value: &str) -> Result<(), String> {
    match key {
        "shares" => def.shares = shares(value)?,
        "default" => def.default = boolean(key, value)?,
        _ if assoc_caps(&mut def.limits, key, value)? => {}
        _ => return Err(unknown("user", key, USER_KEYS)),
    }
    Ok(())
}

/// Sets one setting of a QoS.
pub fn qos(def: &mut QosDef, key: &str, value: &str) -> Result<(), String> {
    match key {
        "priority" => {
            def.priority = value
                .trim()
                .parse()
                .map_err(|_| format!("priority {value:?}: write a whole number (0 or more)"))?
        }
        "max_tres_per_user" => tres(&mut def.max_tres_per_user, key, value)?,
        "max_jobs_per_user" => def.max_jobs_per_user = count(key, value)?,
        "max_submit_jobs_per_user" => def.max_submit_jobs_per_user = count(key, value)?,
        "max_wall" => def.max_wall = secs(key, value)?,
        "grp_tres" => tres(&mut def.grp_tres, key, value)?,
        "grp_jobs" => def.grp_jobs = count(key, value)?,
        "preempt" => def.preempt = names(key, value)?,
        "preempt_mode" => def.preempt_mode = preempt_mode(key, value)?,
        _ => return Err(unknown("qos", key, QOS_KEYS)),
    }
    Ok(())
}

/// Sets one setting of a partition.
pub fn partition(def: &mut PartitionDef, key: &str, value: &str) -> Result<(), String> {
    let weight = |v: &str| match v.trim().parse::<f64>() {
        Ok(w) if w.is_finite() && w >= 0.0 => Ok(w),
        _ => Err(format!("{key} {v:?}: write a number of at least 0")),
    };
    match key {
        "nodes" => def.nodes = names(key, value)?,
        "state" => {
            let s = value.trim().to_ascii_uppercase();
            if !matches!(s.as_str(), "UP" | "DOWN" | "DRAIN" | "INACTIVE") {
                return Err(format!("state {value:?}: use UP, DOWN, DRAIN or INACTIVE"));
            }
            def.state = s;
        }
        "priority_tier" => {
            def.priority_tier = value
                .trim()
                .parse()
                .map_err(|_| format!("priority_tier {value:?}: write a whole number (0 or more)"))?
        }
        "max_time" => def.max_time = secs(key, value)?,
        "default_time" => def.default_time = secs(key, value)?,
        "max_nodes" => {
            def.max_nodes = match count(key, value)? {
                Some(0) => return Err("max_nodes must be at least 1, or none".into()),
                Some(n) => {
                    Some(u32::try_from(n).map_err(|_| format!("max_nodes {n} is too large"))?)
                }
                None => None,
            }
        }
        "def_mem_per_cpu" => def.def_mem_per_cpu = size(key, value)?,
        "def_mem_per_gpu" => def.def_mem_per_gpu = size(key, value)?,
        "max_mem_per_cpu" => def.max_mem_per_cpu = size(key, value)?,
        "max_mem_per_gpu" => def.max_mem_per_gpu = size(key, value)?,
        "billing_cpu" => def.billing_cpu = weight(value)?,
        "billing_memory_gib" => def.billing_memory_gib = weight(value)?,
        "billing_gpu" => def.billing_gpu = weight(value)?,
        "default" => def.default = boolean(key, value)?,
        "preempt_mode" => def.preempt_mode = preempt_mode(key, value)?,
        "allow_accounts" => def.allow_accounts = names(key, value)?,
        "allow_groups" => def.allow_groups = names(key, value)?,
        _ => return Err(unknown("partition", key, PARTITION_KEYS)),
    }
    Ok(())
}

/// A preemption mode (`off`, `requeue`, `cancel`), or `none` for the default.
fn preempt_mode(key: &str, value: &str) -> Result<Option<String>, String> {
    let v = value.trim();
    if v.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    wharf_core::PreemptMode::parse(v)
        .map(|m| Some(m.as_str().to_string()))
        .ok_or_else(|| format!("{key} {value:?}: use off, requeue or cancel"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tres_lists_change_only_the_named_tres_and_none_clears() {
        let mut caps = TresCaps {
            cpu: Some(8),
            ..TresCaps::default()
        };
        tres(&mut caps, "grp_tres", "gpu=16,mem=1G").unwrap();
        assert_eq!(
            (caps.cpu, caps.gpu, caps.mem),
            (Some(8), Some(16), Some(1 << 30))
        );
        tres(&mut caps, "grp_tres", "cpu=none").unwrap();
        assert_eq!(caps.cpu, None);
        tres(&mut caps, "grp_tres", "none").unwrap();
        assert_eq!(caps, TresCaps::default());
        for (text, want) in [
            ("gpus=1", "unknown TRES \"gpus\""),
            ("gpu", "write TRES=COUNT"),
            ("gpu=-1", "write TRES=COUNT"),
            ("mem=lots", "grp_tres mem"),
            // Nothing at all changed nothing, and was audited as a change.
            ("", "write TRES=COUNT"),
            (" , ", "write TRES=COUNT"),
        ] {
            let err = tres(&mut caps, "grp_tres", text).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn budgets_take_whole_minutes_of_cpu_gpu_and_billing_and_refuse_the_rest_whole() {
        let mut caps = TresMinsCaps {
            cpu: Some(50),
            ..TresMinsCaps::default()
        };
        tres_mins(&mut caps, "grp_tres_mins", "gpu=6000, billing=100000").unwrap();
        assert_eq!(
            (caps.cpu, caps.gpu, caps.billing),
            (Some(50), Some(6000), Some(100_000))
        );
        tres_mins(&mut caps, "grp_tres_mins", "cpu=none").unwrap();
        assert_eq!(caps.cpu, None);
        let before = caps;
        for (text, want) in [
            ("gpu=-1", "whole number of minutes"),
            ("gpu=1.5", "whole number of minutes"),
            (
                "gpu=6000,mem=10",
                "unknown TRES \"mem\"; budgets are kept for cpu, gpu and billing",
            ),
            ("gpus=1", "unknown TRES \"gpus\""),
            ("lots", "write TRES=MINUTES"),
            ("", "write TRES=MINUTES"),
            (",", "write TRES=MINUTES"),
            ("gpu=99999999999999999999", "whole number"),
        ] {
            let err = tres_mins(&mut caps, "grp_tres_mins", text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
            // A refused list changes nothing, not even the TRES before the bad one.
            assert_eq!(caps, before, "{text:?}");
        }
        tres_mins(&mut caps, "grp_tres_mins", "none").unwrap();
        assert_eq!(caps, TresMinsCaps::default());
        let mut a = AccountDef::new("a");
        account(&mut a, "grp_tres_mins", "gpu=10").unwrap();
        assert_eq!(a.limits.grp_tres_mins.gpu, Some(10));
        let mut u = UserDef {
            user: "ann".into(),
            account: "a".into(),
            shares: 1,
            default: true,
            limits: AssocCaps::default(),
        };
        user(&mut u, "grp_tres_mins", "cpu=100").unwrap();
        assert_eq!(u.limits.grp_tres_mins.cpu, Some(100));
    }

    #[test]
    fn bad_values_name_the_key() {
        let mut a = AccountDef::new("a");
        for (key, value, want) in [
            ("shares", "0", "at least 1"),
            ("shares", "-3", "at least 1"),
            ("grp_jobs", "-1", "grp_jobs \"-1\""),
            ("coordinators", "ann,b c", "\"b c\" is not a name"),
            ("colour", "red", "unknown account setting \"colour\""),
        ] {
            let err = account(&mut a, key, value).unwrap_err();
            assert!(err.contains(want), "{key}={value}: {err}");
        }
        account(&mut a, "coordinators", "ann, bob,ann").unwrap();
        assert_eq!(a.coordinators, ["ann", "bob"]);
        account(&mut a, "coordinators", "none").unwrap();
        assert!(a.coordinators.is_empty());
        let mut p = PartitionDef::new("p");
        partition(&mut p, "state", "drain").unwrap();
        assert_eq!(p.state, "DRAIN");
        partition(&mut p, "max_time", "1d").unwrap();
        assert_eq!(p.max_time, Some(86400));
        assert!(partition(&mut p, "state", "closed")
            .unwrap_err()
            .contains("UP, DOWN"));
        assert!(partition(&mut p, "preempt_mode", "suspend")
            .unwrap_err()
            .contains("preempt_mode \"suspend\": use off, requeue or cancel"));
        assert!(partition(&mut p, "allow_groups", "a b")
            .unwrap_err()
            .contains("not a name"));
        assert!(partition(&mut p, "max_nodes", "0")
            .unwrap_err()
            .contains("at least 1"));
        assert!(partition(&mut p, "billing_gpu", "-2")
            .unwrap_err()
            .contains("billing_gpu"));
    }

    #[test]
    fn partition_memory_per_cpu_and_gpu_are_sizes() {
        let mut p = PartitionDef::new("p");
        partition(&mut p, "def_mem_per_cpu", "4G").unwrap();
        partition(&mut p, "def_mem_per_gpu", "80G").unwrap();
        partition(&mut p, "max_mem_per_cpu", "8G").unwrap();
        partition(&mut p, "max_mem_per_gpu", "512M").unwrap();
        assert_eq!(p.def_mem_per_cpu, Some(4 << 30));
        assert_eq!(p.def_mem_per_gpu, Some(80 << 30));
        assert_eq!(p.max_mem_per_cpu, Some(8 << 30));
        assert_eq!(p.max_mem_per_gpu, Some(512 << 20));
        partition(&mut p, "def_mem_per_cpu", "none").unwrap();
        assert_eq!(p.def_mem_per_cpu, None);
        let err = partition(&mut p, "max_mem_per_gpu", "lots").unwrap_err();
        assert!(err.starts_with("max_mem_per_gpu: "), "{err}");
    }
}
