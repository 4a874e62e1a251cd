//! Wharf's configured policy, read from the `[scheduler]` section of a controller config file
//! (`docs/configuration.md`), so a replay runs the policy a cluster would run. Other sections
//! are ignored; unknown keys in `[scheduler]` are refused, as the controller refuses them.
//!
//! The controller's own reader is `SchedulerSection::resolve` in `src/config/scheduler.rs` (the `wharf`
//! binary, which a library cannot depend on); this one must stay key-for-key the same until
//! that section moves into a library both use.
//!
//! ```
//! let c = wharf_sim::config::scheduler_config(
//!     "[controller]\nsocket = \"x\"\n[scheduler]\npolicy = \"easy\"\nmax_age = \"1d\"\n",
//! ).unwrap();
//! assert_eq!(c.policy, wharf_core::Policy::Easy);
//! assert_eq!(c.max_age, 24 * 3600 * 1000);
//! ```

use serde::Deserialize;
use wharf_core::{Billing, Config, Policy};

/// Why a config file's `[scheduler]` section was refused; each names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not TOML, or a key of the wrong type or unknown.
    #[error("config file: {0}")]
    Syntax(String),
    /// A value the scheduler cannot use.
    #[error("scheduler.{key}: {why}")]
    Value {
        /// The key.
        key: &'static str,
        /// What is wrong and what to write instead.
        why: String,
    },
}

#[derive(Debug, Default, Deserialize)]
struct File {
    #[serde(default)]
    scheduler: Option<Section>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Section {
    policy: Option<String>,
    reservations: Option<usize>,
    assoc_reservations: Option<usize>,
    keep_reservations_after: Option<String>,
    keep_reservations: Option<usize>,
    start_estimates: Option<usize>,
    max_job_test: Option<usize>,
    half_life: Option<String>,
    max_age: Option<String>,
    favor_small: Option<bool>,
    weight_age: Option<u32>,
    weight_fairshare: Option<u32>,
    weight_job_size: Option<u32>,
    weight_width: Option<u32>,
    weight_partition: Option<u32>,
    weight_qos: Option<u32>,
    partition: Vec<PartitionEntry>,
    // The account tree and users name the cluster's real accounts and users; a replay brings
    // its own (the workload's), so these are read only to refuse what the controller refuses.
    account: Vec<AccountEntry>,
    user: Vec<UserEntry>,
    qos: Vec<QosEntry>,
}

/// One `[[scheduler.qos]]`: kept in the configuration (replayed jobs ask for no QoS, so it only
/// matters once workloads carry one).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct QosEntry {
    name: String,
    #[serde(default)]
    priority: u32,
}

/// One `[[scheduler.account]]` (read, not used: see [`SchedulerFile`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct AccountEntry {
    name: String,
    #[serde(default)]
    parent: Option<String>,
    #[serde(default)]
    shares: Option<u32>,
}

/// One `[[scheduler.user]]` (read, not used: see [`SchedulerFile`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct UserEntry {
    name: String,
    account: String,
    #[serde(default)]
    shares: Option<u32>,
    #[serde(default)]
    default: bool,
}

/// One `[[scheduler.partition]]`. Its node set names the cluster's real nodes, which a replay
/// does not have, so only its billing weights are used (see [`SchedulerFile::billing`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct PartitionEntry {
    name: String,
    nodes: Vec<String>,
    default: bool,
    state: Option<String>,
    priority_tier: Option<u32>,
    max_time: Option<String>,
    default_time: Option<String>,
    max_nodes: Option<u32>,
    billing_cpu: Option<f64>,
    billing_memory_gib: Option<f64>,
    billing_gpu: Option<f64>,
}

/// What a replay takes from a config file: the core configuration (without partitions,
/// accounts or users: the workload brings its own nodes, partitions and owners) and the billing
/// weights of the file's default partition, which decide what fair-share usage counts (CPUs,
/// memory, GPUs).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerFile {
    /// The core configuration.
    pub config: Config,
    /// Billing weights of the default partition (marked `default`, else the first), if any
    /// partition is configured.
    pub billing: Option<Billing>,
}

/// Reads a whole config file: [`scheduler_config`] plus the default partition's billing.
pub fn scheduler_file(text: &str) -> Result<SchedulerFile, ConfigError> {
    let config = scheduler_config(text)?;
    let file: File = toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    let parts = file.scheduler.map(|s| s.partition).unwrap_or_default();
    let default = parts.iter().find(|p| p.default).or(parts.first());
    let billing = match default {
        None => None,
        Some(p) => {
            let d = Billing::default();
            let b = Billing {
                cpu: p.billing_cpu.unwrap_or(d.cpu),
                memory_gib: p.billing_memory_gib.unwrap_or(d.memory_gib),
                gpu: p.billing_gpu.unwrap_or(d.gpu),
            };
            if [b.cpu, b.memory_gib, b.gpu]
                .iter()
                .any(|w| !w.is_finite() || *w < 0.0)
            {
                return Err(ConfigError::Value {
                    key: "partition.billing",
                    why: format!(
                        "partition {:?}: billing weights must be finite and >= 0",
                        p.name
                    ),
                });
            }
            Some(b)
        }
    };
    Ok(SchedulerFile { config, billing })
}

/// The core configuration a config file's `[scheduler]` section sets (the core's defaults for
/// what it leaves out, and for a file without the section).
pub fn scheduler_config(text: &str) -> Result<Config, ConfigError> {
    let file: File = toml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    let s = file.scheduler.unwrap_or_default();
    let policy = match s.policy.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("multifactor") => Policy::Multifactor,
        Some("fcfs") => Policy::Fcfs,
        Some("easy") => Policy::Easy,
        Some(other) => {
            return Err(ConfigError::Value {
                key: "policy",
                why: format!("{other:?}: use \"fcfs\", \"easy\" or \"multifactor\""),
            })
        }
    };
    let mut c = Config::with_policy(policy);
    if let Some(r) = s.reservations {
        if r == 0 {
            return Err(ConfigError::Value {
                key: "reservations",
                why: "must be at least 1: without a reservation a large job can wait forever"
                    .into(),
            });
        }
        c.reservations = r;
    }
    if let Some(m) = s.max_job_test {
        if m == 0 {
            return Err(ConfigError::Value {
                key: "max_job_test",
                why: "must be at least 1".into(),
            });
        }
        c.max_job_test = m;
    }
    let ms = |key: &'static str, text: &str| {
        wharf_api::parse_duration(text)
            .map(|secs| secs.saturating_mul(1000))
            .map_err(|why| ConfigError::Value { key, why })
    };
    if let Some(h) = &s.half_life {
        c.half_life = ms("half_life", h)?;
    }
    if let Some(a) = &s.max_age {
        c.max_age = ms("max_age", a)?;
    }
    if let Some(k) = &s.keep_reservations_after {
        // 0: every reservation is kept from the moment it is made, as the controller reads it.
        c.keep_reservations_after = wharf_api::parse_duration_or_zero(k)
            .map(|secs| secs.saturating_mul(1000))
            .map_err(|why| ConfigError::Value {
                key: "keep_reservations_after",
                why,
            })?;
    }
    if let Some(a) = s.assoc_reservations {
        c.assoc_reservations = a;
    }
    if let Some(k) = s.keep_reservations {
        c.keep_reservations = k;
    }
    if let Some(e) = s.start_estimates {
        c.start_estimates = e;
    }
    if let Some(f) = s.favor_small {
        c.favor_small = f;
    }
    let mut seen = std::collections::BTreeSet::new();
    for q in &s.qos {
        if !seen.insert(q.name.as_str()) {
            return Err(ConfigError::Value {
                key: "qos",
                why: format!("{:?} is defined twice", q.name),
            });
        }
        c.qos.push(wharf_core::Qos {
            name: q.name.clone(),
            priority: q.priority,
        });
    }
    let w = &mut c.weights;
    for (value, slot) in [
        (s.weight_age, &mut w.age),
        (s.weight_fairshare, &mut w.fairshare),
        (s.weight_job_size, &mut w.job_size),
        (s.weight_width, &mut w.width),
        (s.weight_partition, &mut w.partition),
        (s.weight_qos, &mut w.qos),
    ] {
        if let Some(v) = value {
            *slot = v;
        }
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_section_is_the_core_default() {
        assert_eq!(scheduler_config("").unwrap(), Config::default());
        assert_eq!(
            scheduler_config("[agent]\nx = 1\n").unwrap(),
            Config::default()
        );
    }

    #[test]
    fn keys_set_the_config() {
        let c = scheduler_config(
            "[scheduler]\nreservations = 16\nweight_age = 15000\nhalf_life = \"1d\"\nfavor_small = true\n\
             assoc_reservations = 3\nkeep_reservations_after = \"2h\"\nkeep_reservations = 5\n\
             start_estimates = 7\nweight_width = 0\n",
        )
        .unwrap();
        assert_eq!(c.policy, Policy::Multifactor);
        assert_eq!((c.reservations, c.weights.age), (16, 15000));
        assert_eq!(c.weights.width, 0);
        assert_eq!(c.assoc_reservations, 3);
        assert_eq!(c.keep_reservations_after, 2 * 3600 * 1000);
        assert_eq!(c.keep_reservations, 5);
        assert_eq!(c.start_estimates, 7);
        assert_eq!(c.half_life, 24 * 3600 * 1000);
        assert!(c.favor_small);
        let c = scheduler_config("[scheduler]\nkeep_reservations_after = \"0\"\n").unwrap();
        assert_eq!(c.keep_reservations_after, 0);
    }

    #[test]
    fn partitions_are_read_for_their_billing() {
        let f = scheduler_file(
            "[scheduler]\nweight_age = 5\n\
             [[scheduler.partition]]\nname = \"cpu\"\nnodes = [\"c1\"]\n\
             [[scheduler.partition]]\nname = \"gpu\"\ndefault = true\nbilling_cpu = 0.0\nbilling_gpu = 1.0\nmax_time = \"1d\"\n",
        )
        .unwrap();
        assert_eq!(f.config.weights.age, 5);
        assert!(f.config.partitions.is_empty());
        let b = f.billing.unwrap();
        assert_eq!((b.cpu, b.gpu), (0.0, 1.0));
        assert_eq!(scheduler_file("").unwrap().billing, None);
        let f = scheduler_file(
            "[[scheduler.account]]\nname = \"physics\"\nshares = 2\n\
             [[scheduler.user]]\nname = \"ann\"\naccount = \"physics\"\ndefault = true\n",
        )
        .unwrap();
        assert!(
            f.config.accounts.is_empty(),
            "the workload brings its accounts"
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_key() {
        for (text, key) in [
            ("policy = \"sjf\"", "scheduler.policy"),
            ("reservations = 0", "scheduler.reservations"),
            ("half_life = \"soon\"", "scheduler.half_life"),
            ("bogus = 1", "bogus"),
            (
                "[[scheduler.partition]]\nname = \"a\"\nbilling_gpu = -1.0",
                "scheduler.partition.billing",
            ),
            (
                "[[scheduler.user]]\nname = \"ann\"\nacount = \"x\"",
                "acount",
            ),
        ] {
            let err = scheduler_file(&format!("[scheduler]\n{text}\n")).unwrap_err();
            assert!(err.to_string().contains(key), "{text}: {err}");
        }
    }
}
