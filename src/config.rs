//! The configuration file (`/etc/wharf/wharf.toml` or `--config`), with embedded defaults so
//! every daemon starts with none. `docs/configuration.md` describes each key.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Deserialize;
use wharf_api::JobDefaults;

mod scheduler;
pub use scheduler::SchedulerSection;

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
    /// `[accounting]`: how long job records are kept.
    pub accounting: AccountingSection,
    /// `[images]`: how nodes pull registry images.
    pub images: ImagesSection,
}

/// `[images]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesSection {
    /// Registries (`host` or `host:port`) spoken to over plain HTTP, besides loopback ones.
    pub insecure_registries: Vec<String>,
    /// Credentials for registries and mirrors, Docker `config.json` format, readable by root
    /// only.
    pub auth_file: Option<PathBuf>,
    /// Mirrors per registry, tried in order before it:
    /// `{ "docker.io" = ["http://127.0.0.1:5001", "https://mirror.lan"] }`.
    pub mirrors: std::collections::BTreeMap<String, Vec<String>>,
    /// Longest wait to connect to a registry or between two reads of its answer.
    pub timeout: String,
    /// Most bytes pulled images may take in a node's store (`50G`); past it, each pull
    /// evicts the least recently used images that no job uses. Unset: no limit.
    pub cache_quota: Option<String>,
    /// A cluster-wide layer cache on shared storage: nodes look there before downloading a
    /// layer and publish the layers they unpack. Root's own, 0700.
    pub shared_cache: Option<PathBuf>,
    /// Most bytes of layer content the shared cache may hold (`500G`); past it, a node that
    /// adds a layer evicts the least recently used ones no node is copying. Unset: no limit.
    pub shared_cache_quota: Option<String>,
}

impl Default for ImagesSection {
    fn default() -> Self {
        ImagesSection {
            insecure_registries: vec![],
            auth_file: None,
            mirrors: Default::default(),
            timeout: "60s".into(),
            cache_quota: None,
            shared_cache: None,
            shared_cache_quota: None,
        }
    }
}

impl ImagesSection {
    /// `cache_quota` in bytes.
    pub fn quota(&self) -> Result<Option<u64>> {
        self.cache_quota
            .as_deref()
            .map(|q| {
                wharf_api::resources::parse_memory(q).map_err(|e| {
                    anyhow::anyhow!("images.cache_quota {q:?}: {e} (a size such as 50G)")
                })
            })
            .transpose()
    }

    /// The shared layer cache, opened and checked (refused, naming the problem, when others
    /// could write to or reach it), with its quota; `None` when unset.
    pub fn shared_cache(&self) -> Result<Option<wharf_images::SharedCache>> {
        let quota = self
            .shared_cache_quota
            .as_deref()
            .map(|q| {
                wharf_api::resources::parse_memory(q).map_err(|e| {
                    anyhow::anyhow!("images.shared_cache_quota {q:?}: {e} (a size such as 500G)")
                })
            })
            .transpose()?;
        if quota.is_some() && self.shared_cache.is_none() {
            anyhow::bail!("images.shared_cache_quota is set, but images.shared_cache is not");
        }
        self.shared_cache
            .as_deref()
            .map(|p| {
                wharf_images::SharedCache::open(p)
                    .map(|c| c.with_quota(quota))
                    .with_context(|| format!("images.shared_cache {}", p.display()))
            })
            .transpose()
    }

    /// The registry options these settings give; reads the credentials file.
    pub fn registry(&self) -> Result<wharf_images::registry::RegistryOptions> {
        let credentials = match &self.auth_file {
            Some(path) => wharf_images::registry::RegistryOptions::read_auth_file(path)
                .with_context(|| format!("images.auth_file {}", path.display()))?,
            None => Default::default(),
        };
        for (registry, mirrors) in &self.mirrors {
            let bad_key = registry.is_empty()
                || registry.contains('/')
                || registry.contains("://")
                || *registry != registry.to_ascii_lowercase();
            if bad_key {
                anyhow::bail!(
                    "images.mirrors: {registry:?} is not a registry as references name it \
                     (docker.io, nvcr.io, host:port, lowercase)"
                );
            }
            for m in mirrors {
                wharf_images::registry::parse_mirror(m)
                    .map_err(|e| anyhow::anyhow!("images.mirrors.{registry:?}: {e}"))?;
            }
        }
        Ok(wharf_images::registry::RegistryOptions {
            insecure: self.insecure_registries.clone(),
            credentials,
            mirrors: self.mirrors.clone(),
            user: None,
            timeout: duration("images.timeout", &self.timeout)?,
        })
    }
}

/// `[accounting]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccountingSection {
    /// Records of jobs that ended longer ago move out of the database; unset: never.
    pub keep: Option<String>,
    /// Append them to compressed JSON lines in `archive_dir` before deleting them.
    pub archive: bool,
    /// Where; default `<controller.state_dir>/archive`.
    pub archive_dir: Option<PathBuf>,
    /// Where the ledger of ended runs is kept: `sqlite` (the state database) or `postgres`.
    pub store: String,
    /// PostgreSQL: `postgres://user@host:port/dbname`, without a password.
    pub url: Option<String>,
    /// PostgreSQL: host name, address, or the directory of the server's Unix socket.
    pub host: Option<String>,
    /// PostgreSQL: port.
    pub port: Option<u16>,
    /// PostgreSQL: role (default `wharf`).
    pub user: Option<String>,
    /// PostgreSQL: database.
    pub dbname: Option<String>,
    /// PostgreSQL: file holding the role's password (mode 0600 or stricter).
    pub password_file: Option<PathBuf>,
    /// PostgreSQL: longest wait for a connection.
    pub connect_timeout: String,
}

impl Default for AccountingSection {
    fn default() -> Self {
        AccountingSection {
            keep: None,
            archive: true,
            archive_dir: None,
            store: "sqlite".into(),
            url: None,
            host: None,
            port: None,
            user: None,
            dbname: None,
            password_file: None,
            connect_timeout: "5s".into(),
        }
    }
}

impl AccountingSection {
    /// The ledger's engine, checked (a PostgreSQL password file others may read is refused).
    pub fn engine(&self) -> anyhow::Result<wharf_controller::ledger::Engine> {
        use wharf_controller::ledger::{postgres::PgSettings, Engine};
        let pg_keys = [
            ("url", self.url.is_some()),
            ("host", self.host.is_some()),
            ("port", self.port.is_some()),
            ("user", self.user.is_some()),
            ("dbname", self.dbname.is_some()),
            ("password_file", self.password_file.is_some()),
        ];
        match self.store.as_str() {
            "sqlite" => {
                if let Some((key, _)) = pg_keys.iter().find(|k| k.1) {
                    anyhow::bail!(
                        "accounting.{key} applies only with accounting.store = \"postgres\" \
                         (the store is \"sqlite\")"
                    );
                }
                Ok(Engine::Sqlite)
            }
            "postgres" => {
                let settings = PgSettings {
                    url: self.url.clone(),
                    host: self.host.clone(),
                    port: self.port,
                    user: self.user.clone(),
                    dbname: self.dbname.clone(),
                    password_file: self.password_file.clone(),
                    connect_timeout: duration("accounting.connect_timeout", &self.connect_timeout)?,
                };
                settings.config()?;
                Ok(Engine::Postgres(settings))
            }
            other => anyhow::bail!(
                "accounting.store = {other:?}: the stores are \"sqlite\" (the default) and \
                 \"postgres\""
            ),
        }
    }
}

/// `[limits]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    pub max_pending_per_user: u32,
    pub max_request_size: String,
    pub max_agent_request_size: String,
    pub max_connections: usize,
    pub max_connections_per_user: usize,
    pub header_timeout: String,
    pub idle_timeout: String,
    pub max_unauthenticated_connections: usize,
    pub unauthenticated_timeout: String,
    /// Task ids of a job array must be below this.
    pub max_array_size: u32,
}

impl Default for LimitsSection {
    fn default() -> Self {
        let c = wharf_controller::serve::ConnectionLimits::default();
        let tcp = wharf_controller::serve::TcpLimits::default();
        LimitsSection {
            max_pending_per_user: 20_000,
            max_request_size: "1M".into(),
            max_agent_request_size: "64M".into(),
            max_connections: c.max_connections,
            max_connections_per_user: c.max_per_peer,
            header_timeout: "10s".into(),
            idle_timeout: "60s".into(),
            max_unauthenticated_connections: tcp.max_unauthenticated,
            unauthenticated_timeout: "3s".into(),
            max_array_size: 10_001,
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

    /// How the TCP listener admits connections that have not shown the join token.
    pub fn tcp(&self) -> Result<wharf_controller::serve::TcpLimits> {
        let unauthenticated_timeout = duration(
            "limits.unauthenticated_timeout",
            &self.unauthenticated_timeout,
        )?;
        if self.max_unauthenticated_connections == 0 || unauthenticated_timeout.is_zero() {
            anyhow::bail!(
                "limits.max_unauthenticated_connections and limits.unauthenticated_timeout \
                 must be above 0: agents connect through them"
            );
        }
        Ok(wharf_controller::serve::TcpLimits {
            max_unauthenticated: self.max_unauthenticated_connections,
            unauthenticated_timeout,
        })
    }

    /// The largest request body, bytes.
    pub fn max_request_bytes(&self) -> Result<usize> {
        Ok(size("limits.max_request_size", &self.max_request_size)? as usize)
    }

    /// The largest body of an agent's request, bytes.
    pub fn max_agent_request_bytes(&self) -> Result<usize> {
        Ok(size(
            "limits.max_agent_request_size",
            &self.max_agent_request_size,
        )? as usize)
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
    pub controller_ca: Option<PathBuf>,
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
    pub nvml: bool,
    pub sample_interval: String,
    pub backend: String,
    pub docker_socket: PathBuf,
    pub memlock: String,
    pub mounts: Vec<String>,
    pub allowed_mounts: Vec<PathBuf>,
    pub stack: Option<String>,
    pub cdi_dirs: Vec<PathBuf>,
    pub driver_lib_dirs: Vec<PathBuf>,
    pub driver_bin_dirs: Vec<PathBuf>,
    /// Features of the node, for jobs' `--constraint`.
    pub features: Vec<String>,
    pub fabric_interface: Option<String>,
    pub env: std::collections::BTreeMap<String, String>,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            controller: DEFAULT_SOCKET.into(),
            join_token_file: None,
            controller_ca: None,
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
            nvml: true,
            sample_interval: "10s".into(),
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
            features: vec![],
            fabric_interface: None,
            env: Default::default(),
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

/// Parses a duration setting where zero (`0`, `0s`, `0m`, ...) turns the feature off.
pub fn duration_or_off(key: &str, text: &str) -> Result<Duration> {
    wharf_api::parse_duration_or_zero(text)
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
            let token = wharf_client::random_hex(32)?;
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
    #[test]
    fn zero_turns_an_optional_interval_off_and_other_durations_still_parse() {
        use std::time::Duration;
        for off in ["0", "0s", "00m", " 0s "] {
            assert_eq!(
                super::duration_or_off("k", off).unwrap(),
                Duration::ZERO,
                "{off}"
            );
        }
        assert_eq!(
            super::duration_or_off("k", "10s").unwrap(),
            Duration::from_secs(10)
        );
        let e = super::duration_or_off("k", "s").unwrap_err().to_string();
        assert!(e.starts_with("k:"), "{e}");
        assert!(super::duration("k", "0s").is_err());
    }

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
        assert_eq!(file.limits.max_agent_request_bytes().unwrap(), 64 << 20);
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

    #[test]
    fn a_shared_cache_others_could_write_is_refused_naming_the_key() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("layers-cache");
        let text = format!("[images]\nshared_cache = \"{}\"\n", dir.display());
        let file: FileConfig = toml::from_str(&text).unwrap();
        let cache = file.images.shared_cache().unwrap().unwrap();
        assert_eq!(cache.root(), dir);
        assert!(FileConfig::default()
            .images
            .shared_cache()
            .unwrap()
            .is_none());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = format!("{:#}", file.images.shared_cache().unwrap_err());
        assert!(
            err.contains("images.shared_cache") && err.contains("writable by non-root users"),
            "{err}"
        );
    }

    #[test]
    fn the_shared_cache_quota_is_a_size_and_needs_a_shared_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("layers-cache");
        let text = format!(
            "[images]\nshared_cache = \"{}\"\nshared_cache_quota = \"2G\"\n",
            dir.display()
        );
        let file: FileConfig = toml::from_str(&text).unwrap();
        let cache = file.images.shared_cache().unwrap().unwrap();
        assert_eq!(cache.quota(), Some(2 << 30));
        let file: FileConfig = toml::from_str(&text.replace("\"2G\"", "\"lots\"")).unwrap();
        let err = format!("{:#}", file.images.shared_cache().unwrap_err());
        assert!(err.contains("images.shared_cache_quota"), "{err}");
        let file: FileConfig = toml::from_str("[images]\nshared_cache_quota = \"2G\"\n").unwrap();
        let err = format!("{:#}", file.images.shared_cache().unwrap_err());
        assert!(err.contains("images.shared_cache is not"), "{err}");
    }

    #[test]
    fn the_image_cache_quota_is_a_size_or_unset() {
        let file: FileConfig = toml::from_str("[images]\ncache_quota = \"50G\"\n").unwrap();
        assert_eq!(file.images.quota().unwrap(), Some(50 << 30));
        assert_eq!(FileConfig::default().images.quota().unwrap(), None);
        let file: FileConfig = toml::from_str("[images]\ncache_quota = \"lots\"\n").unwrap();
        let err = file.images.quota().unwrap_err().to_string();
        assert!(
            err.contains("images.cache_quota") && err.contains("50G"),
            "{err}"
        );
    }

    #[test]
    fn the_accounting_store_is_sqlite_or_postgres_with_a_private_password_file() {
        use std::os::unix::fs::PermissionsExt;
        use wharf_controller::ledger::Engine;
        let engine = |text: &str| {
            let file: FileConfig = toml::from_str(&format!("[accounting]\n{text}\n")).unwrap();
            file.accounting.engine()
        };
        assert_eq!(engine("").unwrap(), Engine::Sqlite);
        let err = |text: &str| engine(text).unwrap_err().to_string();
        assert!(err("store = \"mysql\"").contains("\"postgres\""));
        assert!(err("host = \"db\"").contains("accounting.host applies only"));
        assert!(err("store = \"postgres\"").contains("accounting.url or accounting.host"));
        let dir = tempfile::tempdir().unwrap();
        let pw = dir.path().join("pw");
        std::fs::write(&pw, "secret").unwrap();
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o604)).unwrap();
        let pg = format!(
            "store = \"postgres\"\nurl = \"postgres://wharf@db:5433/acct\"\npassword_file = \"{}\"",
            pw.display()
        );
        assert!(err(&pg).contains("chmod 600"), "{}", err(&pg));
        std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
        match engine(&pg).unwrap() {
            Engine::Postgres(s) => {
                assert_eq!(s.url.as_deref(), Some("postgres://wharf@db:5433/acct"));
                assert_eq!(s.connect_timeout, Duration::from_secs(5));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mirrors_are_checked_when_read() {
        let registry = |text: &str| {
            let file: FileConfig = toml::from_str(&format!("[images]\n{text}\n")).unwrap();
            file.images.registry()
        };
        let opts =
            registry(r#"mirrors = { "docker.io" = ["http://127.0.0.1:5001", "mirror.lan:5000"] }"#)
                .unwrap();
        assert_eq!(
            opts.mirrors["docker.io"],
            ["http://127.0.0.1:5001", "mirror.lan:5000"]
        );
        let err = |text: &str| registry(text).unwrap_err().to_string();
        let e = err(r#"mirrors = { "docker.io" = ["ftp://m"] }"#);
        assert!(e.contains("images.mirrors") && e.contains("ftp://m"), "{e}");
        let e = err(r#"mirrors = { "docker.io" = ["http://m/path"] }"#);
        assert!(e.contains("no path"), "{e}");
        let e = err(r#"mirrors = { "https://Docker.io" = ["m"] }"#);
        assert!(e.contains("not a registry"), "{e}");
    }
}
