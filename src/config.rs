//! The configuration file (`/etc/wharf/wharf.toml` or `--config`), with embedded defaults so
//! every daemon starts with none. `docs/configuration.md` describes each key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;
use wharf_api::JobDefaults;

/// Default socket of the controller.
pub const DEFAULT_SOCKET: &str = "/run/wharf/wharf.sock";
/// Default configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/wharf/wharf.toml";

/// The controller socket: flag or WHARF_SOCKET, else the default.
pub fn socket(flag: Option<&str>) -> String {
    flag.map(str::to_string)
        .unwrap_or_else(|| DEFAULT_SOCKET.into())
}

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// `[controller]`.
    pub controller: ControllerSection,
    /// `[defaults]`: job defaults and ceilings.
    pub defaults: DefaultsSection,
    /// `[agent]`.
    pub agent: AgentSection,
    /// `[limits]`: what the controller allows each client.
    pub limits: LimitsSection,
    /// `[scheduler]`: the scheduling policy and its weights.
    pub scheduler: SchedulerSection,
}

/// `[scheduler]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSection {
    pub policy: String,
    pub reservations: usize,
    pub max_job_test: usize,
    pub half_life: String,
    pub max_age: String,
    pub favor_small: bool,
    pub weight_age: u32,
    pub weight_fairshare: u32,
    pub weight_job_size: u32,
    pub weight_partition: u32,
    pub weight_qos: u32,
    /// `[[scheduler.partition]]` entries; none: every node in one partition.
    #[serde(rename = "partition")]
    pub partitions: Vec<PartitionSection>,
    /// `[[scheduler.account]]`: the fair-share account tree.
    #[serde(rename = "account")]
    pub accounts: Vec<AccountSection>,
    /// `[[scheduler.user]]`: users' shares in accounts.
    #[serde(rename = "user")]
    pub users: Vec<UserSection>,
}

/// One `[[scheduler.account]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountSection {
    pub name: String,
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default = "one")]
    pub shares: u32,
}

/// One `[[scheduler.user]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSection {
    pub name: String,
    pub account: String,
    #[serde(default = "one")]
    pub shares: u32,
    #[serde(default)]
    pub default: bool,
}

fn one() -> u32 {
    1
}

/// One `[[scheduler.partition]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PartitionSection {
    pub name: String,
    pub nodes: Vec<String>,
    pub default: bool,
    pub state: String,
    pub priority_tier: u32,
    pub max_time: Option<String>,
    pub default_time: Option<String>,
    pub max_nodes: Option<u32>,
    pub billing_cpu: f64,
    pub billing_memory_gib: f64,
    pub billing_gpu: f64,
}

impl Default for PartitionSection {
    fn default() -> Self {
        let b = wharf_controller::SchedulerBilling::default();
        PartitionSection {
            name: String::new(),
            nodes: vec![],
            default: false,
            state: "up".into(),
            priority_tier: 0,
            max_time: None,
            default_time: None,
            max_nodes: None,
            billing_cpu: b.cpu,
            billing_memory_gib: b.memory_gib,
            billing_gpu: b.gpu,
        }
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl PartitionSection {
    fn resolve(&self) -> Result<wharf_controller::SchedulerPartition> {
        use wharf_controller::PartitionState;
        let name = &self.name;
        let key = format!("scheduler.partition {name:?}");
        if !valid_name(name) {
            anyhow::bail!("{key}: name must be 1 to 64 letters, digits, '-', '_' or '.'");
        }
        let state = match self.state.to_ascii_lowercase().as_str() {
            "up" => PartitionState::Up,
            "down" => PartitionState::Down,
            "drain" => PartitionState::Drain,
            "inactive" => PartitionState::Inactive,
            other => anyhow::bail!(
                "{key}: state {other:?}: use \"up\", \"down\", \"drain\" or \"inactive\""
            ),
        };
        let ms = |what: &str, text: &Option<String>| -> Result<Option<u64>> {
            text.as_deref()
                .map(|t| Ok(duration(&format!("{key} {what}"), t)?.as_millis() as u64))
                .transpose()
        };
        for (what, w) in [
            ("billing_cpu", self.billing_cpu),
            ("billing_memory_gib", self.billing_memory_gib),
            ("billing_gpu", self.billing_gpu),
        ] {
            if !(w.is_finite() && w >= 0.0) {
                anyhow::bail!("{key}: {what} must be a number at least 0");
            }
        }
        if self.max_nodes == Some(0) {
            anyhow::bail!("{key}: max_nodes must be at least 1");
        }
        let nodes: Vec<&str> = self.nodes.iter().map(String::as_str).collect();
        let mut p = wharf_controller::SchedulerPartition::new(name, &nodes);
        p.state = state;
        p.priority_tier = self.priority_tier;
        p.max_time = ms("max_time", &self.max_time)?;
        p.default_time = ms("default_time", &self.default_time)?;
        p.max_nodes = self.max_nodes;
        p.billing = wharf_controller::SchedulerBilling {
            cpu: self.billing_cpu,
            memory_gib: self.billing_memory_gib,
            gpu: self.billing_gpu,
        };
        Ok(p)
    }
}

impl Default for SchedulerSection {
    fn default() -> Self {
        let c = wharf_controller::SchedulerConfig::default();
        SchedulerSection {
            policy: "multifactor".into(),
            reservations: c.reservations,
            max_job_test: c.max_job_test,
            half_life: "7d".into(),
            max_age: "7d".into(),
            favor_small: c.favor_small,
            weight_age: c.weights.age,
            weight_fairshare: c.weights.fairshare,
            weight_job_size: c.weights.job_size,
            weight_partition: c.weights.partition,
            weight_qos: c.weights.qos,
            partitions: vec![],
            accounts: vec![],
            users: vec![],
        }
    }
}

impl SchedulerSection {
    /// The scheduler's configuration.
    pub fn resolve(&self) -> Result<wharf_controller::SchedulerConfig> {
        use wharf_controller::SchedulerPolicy;
        let policy = match self.policy.to_ascii_lowercase().as_str() {
            "fcfs" => SchedulerPolicy::Fcfs,
            "easy" => SchedulerPolicy::Easy,
            "multifactor" => SchedulerPolicy::Multifactor,
            other => anyhow::bail!(
                "scheduler.policy {other:?}: use \"fcfs\", \"easy\" or \"multifactor\""
            ),
        };
        if self.reservations == 0 {
            anyhow::bail!(
                "scheduler.reservations must be at least 1: without a reservation a large job \
                 can wait forever behind small ones"
            );
        }
        if self.max_job_test == 0 {
            anyhow::bail!("scheduler.max_job_test must be at least 1");
        }
        let ms = |key: &str, text: &str| -> Result<u64> {
            Ok(duration(key, text)?.as_millis().min(u64::MAX as u128) as u64)
        };
        let mut c = wharf_controller::SchedulerConfig::with_policy(policy);
        c.reservations = self.reservations;
        c.max_job_test = self.max_job_test;
        c.half_life = ms("scheduler.half_life", &self.half_life)?;
        c.max_age = ms("scheduler.max_age", &self.max_age)?;
        c.favor_small = self.favor_small;
        c.weights.age = self.weight_age;
        c.weights.fairshare = self.weight_fairshare;
        c.weights.job_size = self.weight_job_size;
        c.weights.partition = self.weight_partition;
        c.weights.qos = self.weight_qos;
        let mut names = std::collections::BTreeSet::new();
        for p in &self.partitions {
            if !names.insert(p.name.as_str()) {
                anyhow::bail!("scheduler.partition {:?} is defined twice", p.name);
            }
            c.partitions.push(p.resolve()?);
        }
        let defaults: Vec<&str> = self
            .partitions
            .iter()
            .filter(|p| p.default)
            .map(|p| p.name.as_str())
            .collect();
        if defaults.len() > 1 {
            anyhow::bail!(
                "scheduler.partition: {} are all marked default; mark one",
                defaults.join(", ")
            );
        }
        c.default_partition = defaults.first().map(|d| d.to_string());
        self.resolve_accounts(&mut c)?;
        Ok(c)
    }

    /// The account tree and users' shares. Each user's default account comes first among
    /// their entries (the one marked `default`, else the first listed).
    fn resolve_accounts(&self, c: &mut wharf_controller::SchedulerConfig) -> Result<()> {
        let mut names = std::collections::BTreeSet::new();
        for a in &self.accounts {
            let key = format!("scheduler.account {:?}", a.name);
            if !valid_name(&a.name) {
                anyhow::bail!("{key}: name must be 1 to 64 letters, digits, '-', '_' or '.'");
            }
            if !names.insert(a.name.as_str()) {
                anyhow::bail!("{key} is defined twice");
            }
            if a.shares == 0 {
                anyhow::bail!("{key}: shares must be at least 1");
            }
        }
        for a in &self.accounts {
            if let Some(p) = &a.parent {
                if !names.contains(p.as_str()) || p == &a.name {
                    anyhow::bail!(
                        "scheduler.account {:?}: parent {p:?} is not another defined account",
                        a.name
                    );
                }
            }
            c.accounts.push(wharf_controller::SchedulerAccount {
                name: a.name.clone(),
                parent: a.parent.clone(),
                shares: a.shares,
            });
        }
        let mut seen = std::collections::BTreeSet::new();
        for u in &self.users {
            let key = format!("scheduler.user {:?} in {:?}", u.name, u.account);
            if !names.contains(u.account.as_str()) {
                anyhow::bail!("{key}: no [[scheduler.account]] is named {:?}", u.account);
            }
            if !seen.insert((u.name.as_str(), u.account.as_str())) {
                anyhow::bail!("{key} is defined twice");
            }
            if u.shares == 0 {
                anyhow::bail!("{key}: shares must be at least 1");
            }
            let marked = self
                .users
                .iter()
                .filter(|o| o.name == u.name && o.default)
                .count();
            if marked > 1 {
                anyhow::bail!(
                    "scheduler.user {:?} has {marked} default accounts; mark one",
                    u.name
                );
            }
        }
        let mut ordered: Vec<&UserSection> = self.users.iter().collect();
        // Stable: the default entry first, then the order written.
        ordered.sort_by_key(|u| !u.default);
        for u in ordered {
            c.users.push(wharf_controller::SchedulerUserShares {
                user: u.name.clone(),
                account: u.account.clone(),
                shares: u.shares,
            });
        }
        Ok(())
    }
}

/// `[limits]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    pub max_pending_per_user: u32,
    pub max_request_size: String,
    pub max_connections: usize,
    pub max_connections_per_user: usize,
    pub header_timeout: String,
    pub idle_timeout: String,
}

impl Default for LimitsSection {
    fn default() -> Self {
        let c = wharf_controller::serve::ConnectionLimits::default();
        LimitsSection {
            max_pending_per_user: 1000,
            max_request_size: "1M".into(),
            max_connections: c.max_connections,
            max_connections_per_user: c.max_per_peer,
            header_timeout: "10s".into(),
            idle_timeout: "60s".into(),
        }
    }
}

impl LimitsSection {
    /// The connection limits; the idle timeout must outlast an agent's held poll.
    pub fn connections(
        &self,
        poll_wait: Duration,
    ) -> Result<wharf_controller::serve::ConnectionLimits> {
        let header_timeout = duration("limits.header_timeout", &self.header_timeout)?;
        let idle_timeout = duration("limits.idle_timeout", &self.idle_timeout)?;
        if idle_timeout <= poll_wait + Duration::from_secs(5) {
            anyhow::bail!(
                "limits.idle_timeout ({}s) must be longer than controller.poll_wait ({}s) plus 5s: \
                 an agent's poll is held that long without a byte moving",
                idle_timeout.as_secs(),
                poll_wait.as_secs()
            );
        }
        if self.max_connections == 0 || self.max_connections_per_user == 0 {
            anyhow::bail!(
                "limits.max_connections and limits.max_connections_per_user must be at least 1"
            );
        }
        Ok(wharf_controller::serve::ConnectionLimits {
            max_connections: self.max_connections,
            max_per_peer: self.max_connections_per_user,
            header_timeout,
            idle_timeout,
        })
    }

    /// The largest request body, bytes.
    pub fn max_request_bytes(&self) -> Result<usize> {
        Ok(size("limits.max_request_size", &self.max_request_size)? as usize)
    }
}

/// `[controller]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControllerSection {
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub listen: Option<String>,
    pub join_token_file: Option<PathBuf>,
    pub admins: Vec<String>,
    pub node_timeout: String,
    pub poll_wait: String,
}

impl Default for ControllerSection {
    fn default() -> Self {
        ControllerSection {
            state_dir: "/var/lib/wharf/controller".into(),
            socket: DEFAULT_SOCKET.into(),
            listen: None,
            join_token_file: None,
            admins: vec![],
            node_timeout: "60s".into(),
            poll_wait: "10s".into(),
        }
    }
}

/// `[defaults]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultsSection {
    pub cpus: u32,
    pub memory: String,
    pub time: String,
    pub max_time: String,
    pub image: String,
    pub max_cpus: Option<u32>,
    pub max_memory: Option<String>,
    pub max_gpus: Option<u32>,
    pub max_env_size: String,
    pub max_command_size: String,
}

impl Default for DefaultsSection {
    fn default() -> Self {
        DefaultsSection {
            cpus: 1,
            memory: "1G".into(),
            time: "1h".into(),
            max_time: "7d".into(),
            image: "host".into(),
            max_cpus: None,
            max_memory: None,
            max_gpus: None,
            max_env_size: "64K".into(),
            max_command_size: "128K".into(),
        }
    }
}

/// `[agent]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSection {
    pub controller: String,
    pub join_token_file: Option<PathBuf>,
    pub node_name: Option<String>,
    pub state_dir: PathBuf,
    pub image_store: PathBuf,
    pub root_host_id: u32,
    pub grace: String,
    pub tmp_size: String,
    pub shm_size: String,
    pub pids_limit: Option<i64>,
    pub cgroup_parent: String,
    pub reserved_memory: String,
    pub dev_root: PathBuf,
    pub backend: String,
    pub docker_socket: PathBuf,
    pub memlock: String,
    pub mounts: Vec<String>,
    pub allowed_mounts: Vec<PathBuf>,
    pub stack: Option<String>,
    pub cdi_dirs: Vec<PathBuf>,
    pub driver_lib_dirs: Vec<PathBuf>,
    pub driver_bin_dirs: Vec<PathBuf>,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            controller: DEFAULT_SOCKET.into(),
            join_token_file: None,
            node_name: None,
            state_dir: "/var/lib/wharf/agent".into(),
            image_store: "/var/lib/wharf/images".into(),
            root_host_id: 65534,
            grace: "10s".into(),
            tmp_size: "1G".into(),
            shm_size: "64M".into(),
            pids_limit: Some(32768),
            cgroup_parent: "wharf".into(),
            reserved_memory: "512M".into(),
            dev_root: "/dev".into(),
            backend: "oci".into(),
            docker_socket: "/var/run/docker.sock".into(),
            memlock: "unlimited".into(),
            mounts: vec![],
            allowed_mounts: vec![],
            stack: None,
            cdi_dirs: vec!["/etc/cdi".into(), "/var/run/cdi".into()],
            driver_lib_dirs: vec![
                "/usr/lib/x86_64-linux-gnu".into(),
                "/usr/lib64".into(),
                "/usr/lib".into(),
            ],
            driver_bin_dirs: vec!["/usr/bin".into()],
        }
    }
}

/// Parses `[agent] mounts` entries: `PATH`, `PATH:ro`, `SOURCE:DEST` or `SOURCE:DEST:ro`.
pub fn binds(entries: &[String]) -> Result<Vec<wharf_runtime::Bind>> {
    entries
        .iter()
        .map(|e| {
            let m = wharf_api::job::parse_mount(e, true)
                .map_err(|why| anyhow::anyhow!("agent.mounts: {why}"))?;
            Ok(wharf_runtime::Bind {
                source: m.source.into(),
                destination: m.destination,
                read_only: m.read_only,
                beneath: None,
            })
        })
        .collect()
}

/// Reads `path` (or the default file when it exists; embedded defaults otherwise).
pub fn load(path: Option<&Path>) -> Result<FileConfig> {
    let (path, required) = match path {
        Some(p) => (p.to_path_buf(), true),
        None => (PathBuf::from(DEFAULT_CONFIG), false),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if !required && e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(FileConfig::default())
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Parses a duration setting.
pub fn duration(key: &str, text: &str) -> Result<Duration> {
    wharf_api::parse_duration(text)
        .map(Duration::from_secs)
        .map_err(|e| anyhow::anyhow!("{key}: {e}"))
}

/// Parses a size setting.
pub fn size(key: &str, text: &str) -> Result<u64> {
    wharf_api::parse_memory(text).map_err(|e| anyhow::anyhow!("{key}: {e}"))
}

/// A resource limit setting: a size, or `unlimited` (`u64::MAX`).
pub fn limit(key: &str, text: &str) -> Result<u64> {
    wharf_api::job::parse_limit(text).map_err(|e| anyhow::anyhow!("{key}: {e}"))
}

impl DefaultsSection {
    /// As job defaults.
    pub fn resolve(&self) -> Result<JobDefaults> {
        Ok(JobDefaults {
            cpus: self.cpus,
            memory: size("defaults.memory", &self.memory)?,
            time: duration("defaults.time", &self.time)?.as_secs(),
            max_time: duration("defaults.max_time", &self.max_time)?.as_secs(),
            image: self.image.clone(),
            max_resources: wharf_api::limits::Ceiling {
                cpus: self.max_cpus,
                memory: self
                    .max_memory
                    .as_deref()
                    .map(|m| size("defaults.max_memory", m))
                    .transpose()?,
                gpus: self.max_gpus,
            },
            max_env_bytes: size("defaults.max_env_size", &self.max_env_size)? as usize,
            max_command_bytes: size("defaults.max_command_size", &self.max_command_size)? as usize,
        })
    }
}

/// Reads the join token from `file`, creating a random one (mode 0600) if it does not exist.
pub fn join_token(file: &Path, create: bool) -> Result<String> {
    match std::fs::read_to_string(file) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
        Ok(_) => anyhow::bail!("join token file {} is empty", file.display()),
        Err(e) if create && e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let token = random_hex(32)?;
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(file)
                .with_context(|| format!("creating {}", file.display()))?;
            writeln!(f, "{token}")?;
            Ok(token)
        }
        Err(e) => Err(e).with_context(|| format!("reading join token {}", file.display())),
    }
}

/// `n` random bytes from the kernel, as hex.
pub fn random_hex(n: usize) -> Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The host name, for the node name.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Resolves user names or uids of `[controller] admins`.
pub fn admin_uids(names: &[String]) -> Result<Vec<u32>> {
    names
        .iter()
        .map(|n| match n.parse::<u32>() {
            Ok(uid) => Ok(uid),
            Err(_) => nix::unistd::User::from_name(n)
                .ok()
                .flatten()
                .map(|u| u.uid.as_raw())
                .ok_or_else(|| anyhow::anyhow!("controller.admins: no user {n:?}")),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_ceilings_parse_and_are_checked() {
        let file: FileConfig = toml::from_str(
            "[defaults]\nmax_gpus = 8\nmax_memory = \"512G\"\nmax_env_size = \"16K\"\n\
             [limits]\nmax_pending_per_user = 5\nheader_timeout = \"3s\"\nidle_timeout = \"20s\"\n",
        )
        .unwrap();
        let d = file.defaults.resolve().unwrap();
        assert_eq!(d.max_resources.gpus, Some(8));
        assert_eq!(d.max_resources.memory, Some(512 << 30));
        assert_eq!(d.max_resources.cpus, None);
        assert_eq!(d.max_env_bytes, 16 << 10);
        let c = file.limits.connections(Duration::from_secs(10)).unwrap();
        assert_eq!(c.header_timeout, Duration::from_secs(3));
        assert_eq!(file.limits.max_request_bytes().unwrap(), 1 << 20);
        let err = file
            .limits
            .connections(Duration::from_secs(30))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("limits.idle_timeout") && err.contains("poll_wait"),
            "{err}"
        );
        assert!(toml::from_str::<FileConfig>("[limits]\nmax_conections = 1\n").is_err());
    }

    #[test]
    fn scheduler_section_chooses_the_policy_and_refuses_nonsense() {
        let file: FileConfig = toml::from_str(
            "[scheduler]\npolicy = \"easy\"\nhalf_life = \"1d\"\nweight_fairshare = 5\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.policy, wharf_controller::SchedulerPolicy::Easy);
        assert_eq!(c.half_life, 24 * 3600 * 1000);
        assert_eq!(c.weights.fairshare, 5);
        let d = FileConfig::default().scheduler.resolve().unwrap();
        assert_eq!(d, wharf_controller::SchedulerConfig::default());
        let file: FileConfig = toml::from_str(
            "[[scheduler.partition]]\nname = \"cpu\"\n\
             [[scheduler.partition]]\nname = \"gpu\"\nnodes = [\"g1\"]\ndefault = true\n\
             max_time = \"1d\"\npriority_tier = 2\nbilling_gpu = 10.0\nstate = \"drain\"\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.default_partition.as_deref(), Some("gpu"));
        let gpu = &c.partitions[1];
        assert_eq!(gpu.nodes, vec!["g1".to_string()]);
        assert_eq!(gpu.max_time, Some(24 * 3600 * 1000));
        assert_eq!(gpu.billing.gpu, 10.0);
        assert_eq!(gpu.state, wharf_controller::PartitionState::Drain);
        for (text, want) in [
            ("name = \"a\"\n[[scheduler.partition]]\nname = \"a\"", "defined twice"),
            ("name = \"a b\"", "name must be"),
            ("name = \"a\"\nstate = \"closed\"", "state \"closed\""),
            ("name = \"a\"\nbilling_gpu = -1.0", "billing_gpu"),
            ("name = \"a\"\ndefault = true\n[[scheduler.partition]]\nname = \"b\"\ndefault = true", "mark one"),
        ] {
            let file: FileConfig =
                toml::from_str(&format!("[[scheduler.partition]]\n{text}\n")).unwrap();
            let err = file.scheduler.resolve().unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        for (text, want) in [
            ("policy = \"sjf\"", "scheduler.policy \"sjf\""),
            ("reservations = 0", "scheduler.reservations"),
            ("half_life = \"soon\"", "scheduler.half_life"),
        ] {
            let file: FileConfig = toml::from_str(&format!("[scheduler]\n{text}\n")).unwrap();
            let err = file.scheduler.resolve().unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn accounts_and_users_build_the_fair_share_tree() {
        let file: FileConfig = toml::from_str(
            "[[scheduler.account]]\nname = \"physics\"\nshares = 3\n\
             [[scheduler.account]]\nname = \"theory\"\nparent = \"physics\"\n\
             [[scheduler.user]]\nname = \"ann\"\naccount = \"physics\"\n\
             [[scheduler.user]]\nname = \"ann\"\naccount = \"theory\"\ndefault = true\n",
        )
        .unwrap();
        let c = file.scheduler.resolve().unwrap();
        assert_eq!(c.accounts[0].shares, 3);
        assert_eq!(c.accounts[1].parent.as_deref(), Some("physics"));
        assert_eq!(
            c.users[0].account, "theory",
            "the default account comes first"
        );
        for (text, want) in [
            (
                "[[scheduler.account]]\nname = \"a\"\nparent = \"b\"",
                "parent \"b\"",
            ),
            (
                "[[scheduler.user]]\nname = \"u\"\naccount = \"nope\"",
                "no [[scheduler.account]]",
            ),
            (
                "[[scheduler.account]]\nname = \"a\"\nshares = 0",
                "shares must be",
            ),
        ] {
            let file: FileConfig = toml::from_str(text).unwrap();
            let err = file.scheduler.resolve().unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn limits_are_sizes_or_unlimited() {
        assert_eq!(limit("agent.memlock", "unlimited").unwrap(), u64::MAX);
        assert_eq!(limit("agent.memlock", "Infinity").unwrap(), u64::MAX);
        assert_eq!(limit("agent.stack", "64M").unwrap(), 64 << 20);
        let err = limit("agent.stack", "12XB").unwrap_err().to_string();
        assert!(
            err.starts_with("agent.stack: ") && err.contains("unlimited"),
            "{err}"
        );
    }
}
