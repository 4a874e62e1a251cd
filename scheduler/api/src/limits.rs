//! Ceilings on what one submit may ask for, checked before anything is stored: a request that
//! can never run, or that would make the controller hold megabytes per job, is refused with
//! the limit it broke instead of waiting forever.
//!
//! ```
//! use wharf_api::limits::fits_some_node;
//! use wharf_api::Resources;
//! let node = Resources { cpus: 8, memory: 32 << 30, gpus: 2 };
//! let need = Resources { cpus: 1, memory: 1 << 30, gpus: 1000 };
//! let err = fits_some_node(&need, [node]).unwrap_err();
//! assert!(err.contains("1000 GPUs (the largest node has 2)"), "{err}");
//! ```

use serde::{Deserialize, Serialize};

use crate::job::JobRequest;
use crate::resources::{format_memory, Resources};

/// Longest path a job may name (Linux's PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// Default of `[defaults] max_env_size`: 64 KiB of names and values.
pub fn default_env_bytes() -> usize {
    64 << 10
}

/// Default of `[defaults] max_command_size`: 128 KiB, the kernel's limit for one argument
/// (a script is passed to `/bin/sh -c` as one).
pub fn default_command_bytes() -> usize {
    128 << 10
}

/// Site maxima per job; `None` leaves an axis to the nodes ([`fits_some_node`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ceiling {
    /// Most CPUs.
    pub cpus: Option<u32>,
    /// Most memory, bytes.
    pub memory: Option<u64>,
    /// Most GPUs.
    pub gpus: Option<u32>,
}

impl Ceiling {
    /// Refuses `need` when it is over a configured maximum, naming it.
    pub fn check(&self, need: &Resources) -> Result<(), String> {
        let over = |what: &str, asked: String, max: String, key: &str| {
            Err(format!(
                "`{what}` = {asked} is over the site's maximum of {max} per job ([defaults] \
                 {key}); ask for less"
            ))
        };
        if let Some(max) = self.cpus.filter(|&m| need.cpus > m) {
            return over("cpus", need.cpus.to_string(), max.to_string(), "max_cpus");
        }
        if let Some(max) = self.memory.filter(|&m| need.memory > m) {
            return over(
                "memory",
                format_memory(need.memory),
                format_memory(max),
                "max_memory",
            );
        }
        if let Some(max) = self.gpus.filter(|&m| need.gpus > m) {
            return over("gpus", need.gpus.to_string(), max.to_string(), "max_gpus");
        }
        Ok(())
    }
}

/// Refuses `need` when no node ever registered (`nodes`, up or down) could hold it. With no
/// node registered yet nothing is known, and only the configured [`Ceiling`] applies.
pub fn fits_some_node(
    need: &Resources,
    nodes: impl IntoIterator<Item = Resources>,
) -> Result<(), String> {
    let nodes: Vec<Resources> = nodes.into_iter().collect();
    if nodes.is_empty() || nodes.iter().any(|n| need.fits_in(n)) {
        return Ok(());
    }
    let largest = nodes.iter().fold(Resources::default(), |a, n| Resources {
        cpus: a.cpus.max(n.cpus),
        memory: a.memory.max(n.memory),
        gpus: a.gpus.max(n.gpus),
    });
    let mut parts = Vec::new();
    if need.cpus > largest.cpus {
        parts.push(format!(
            "{} CPUs (the largest node has {})",
            need.cpus, largest.cpus
        ));
    }
    if need.memory > largest.memory {
        parts.push(format!(
            "{} memory (the largest node has {})",
            format_memory(need.memory),
            format_memory(largest.memory)
        ));
    }
    if need.gpus > largest.gpus {
        parts.push(format!(
            "{} GPUs (the largest node has {})",
            need.gpus, largest.gpus
        ));
    }
    if parts.is_empty() {
        parts.push(format!(
            "{} CPUs, {} memory and {} GPUs together (no single node has them all)",
            need.cpus,
            format_memory(need.memory),
            need.gpus
        ));
    }
    Err(format!(
        "no node of this cluster can ever run this job: it asks for {}; ask for less",
        parts.join(", ")
    ))
}

/// Refuses a request whose text fields are too large to keep, naming the field and the limit.
pub fn check_sizes(req: &JobRequest, cwd: &str, d: &crate::JobDefaults) -> Result<(), String> {
    let too_big = |what: &str, size: usize, limit: usize, hint: &str| {
        Err(format!(
            "`{what}` is {size} bytes; the limit is {limit}{hint}"
        ))
    };
    if let Some(cmd) = &req.command {
        let size: usize = cmd.iter().map(|a| a.len() + 1).sum();
        if size > d.max_command_bytes {
            return too_big(
                "command",
                size,
                d.max_command_bytes,
                " ([defaults] max_command_size); put long argument lists in a file",
            );
        }
    }
    if let Some(script) = &req.script {
        if script.len() > d.max_command_bytes {
            return too_big(
                "script",
                script.len(),
                d.max_command_bytes,
                " ([defaults] max_command_size); run a script file from shared storage instead",
            );
        }
    }
    let args: usize = req.args.iter().map(|a| a.len() + 1).sum();
    if args > d.max_command_bytes {
        return too_big(
            "args",
            args,
            d.max_command_bytes,
            " ([defaults] max_command_size); put long argument lists in a file",
        );
    }
    let env: usize = req.env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if env > d.max_env_bytes {
        return too_big(
            "env",
            env,
            d.max_env_bytes,
            " ([defaults] max_env_size); pass large data in a file",
        );
    }
    let paths = [
        ("cwd", Some(cwd)),
        ("workdir", req.workdir.as_deref()),
        ("output", req.output.as_deref()),
        ("error", req.error.as_deref()),
    ];
    for (what, path) in paths {
        if let Some(p) = path.filter(|p| p.len() > MAX_PATH) {
            return too_big(what, p.len(), MAX_PATH, "");
        }
    }
    if let Some(m) = req.mounts.iter().find(|m| m.len() > 2 * MAX_PATH + 3) {
        return too_big("mounts` entry", m.len(), 2 * MAX_PATH + 3, "");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::JobDefaults;

    fn node(cpus: u32, gib: u64, gpus: u32) -> Resources {
        Resources {
            cpus,
            memory: gib << 30,
            gpus,
        }
    }

    #[test]
    fn a_job_must_fit_one_node_ever_registered() {
        let nodes = [node(64, 256, 0), node(8, 64, 8)];
        assert!(fits_some_node(&node(64, 1, 0), nodes).is_ok());
        assert!(fits_some_node(&node(8, 1, 8), nodes).is_ok());
        let e = fits_some_node(&node(1, 1, 1000), nodes).unwrap_err();
        assert!(e.contains("1000 GPUs (the largest node has 8)"), "{e}");
        let e = fits_some_node(
            &Resources {
                cpus: 1,
                memory: u64::MAX,
                gpus: 0,
            },
            nodes,
        )
        .unwrap_err();
        assert!(e.contains("memory (the largest node has 256G)"), "{e}");
        let e = fits_some_node(&node(64, 1, 8), nodes).unwrap_err();
        assert!(e.contains("no single node has them all"), "{e}");
        assert!(fits_some_node(&node(1000, 1, 1000), []).is_ok());
    }

    #[test]
    fn configured_maxima_name_their_key() {
        let c = Ceiling {
            cpus: Some(4),
            memory: Some(8 << 30),
            gpus: None,
        };
        assert!(c.check(&node(4, 8, 100)).is_ok());
        assert!(c.check(&node(5, 1, 0)).unwrap_err().contains("max_cpus"));
        let e = c.check(&node(1, 9, 0)).unwrap_err();
        assert!(
            e.contains("`memory` = 9G") && e.contains("max_memory"),
            "{e}"
        );
    }

    #[test]
    fn sizes_are_capped_with_the_field_named() {
        let d = JobDefaults::default();
        let mut req = JobRequest {
            command: Some(vec!["/bin/true".into()]),
            ..Default::default()
        };
        assert!(check_sizes(&req, "/", &d).is_ok());
        req.env.insert("BIG".into(), "x".repeat(d.max_env_bytes));
        let e = req.resolve("/", &d).unwrap_err();
        assert!(
            e.starts_with("`env` is ") && e.contains("max_env_size"),
            "{e}"
        );
        req.env.clear();
        req.command = Some(vec!["a".repeat(1000); 200]);
        let e = req.resolve("/", &d).unwrap_err();
        assert!(e.starts_with("`command` is 200200 bytes"), "{e}");
        req.command = None;
        req.script = Some("#".repeat(d.max_command_bytes + 1));
        assert!(req.resolve("/", &d).unwrap_err().starts_with("`script` is"));
        req.script = Some("true".into());
        req.workdir = Some(format!("/{}", "d".repeat(MAX_PATH)));
        assert!(req
            .resolve("/", &d)
            .unwrap_err()
            .starts_with("`workdir` is"));
    }
}
