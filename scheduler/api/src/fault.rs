//! Why a launch failed, in types: whose fault it is (the node's, the job's, or a passing
//! outage's) and which step failed. The runtime and the agent classify each failure; the
//! controller acts on the kind: a node fault drains the node and requeues the job, a job
//! fault fails the job, a transient fault requeues the job a few times. `docs/architecture.md`
//! has the table of codes.
//!
//! Unknown values (from a newer agent) read as [`FaultKind::Job`] and [`FaultCode::Other`],
//! so that a report is never refused for them and the job fails as it did before faults had
//! kinds.

use serde::{Deserialize, Serialize};

/// Whose fault a failed launch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The node cannot run jobs as it should: drain it, requeue the job elsewhere.
    Node,
    /// Something outside the node and the job is out for now (the registry): requeue the job,
    /// leave the node up.
    Transient,
    /// The job is wrong (or asks for what this node never offers): fail it.
    #[serde(other)]
    Job,
}

impl FaultKind {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Node => "node",
            FaultKind::Job => "job",
            FaultKind::Transient => "transient",
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which step of a launch failed, and so whose fault it is ([`FaultCode::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultCode {
    // The node's.
    /// The job's cgroup could not be made, limited or joined.
    Cgroup,
    /// The kernel refused the sandbox's namespaces or their id maps.
    Namespaces,
    /// Another step of the sandbox that is the node's own: mounting /proc, /sys or /dev,
    /// pivot_root, taking the job's ids, the seccomp profile.
    Sandbox,
    /// A device node of an allocated GPU (or a file the node's CDI spec names) is missing.
    Device,
    /// The node's image store cannot be read or written.
    ImageStore,
    /// The node's disk is full.
    DiskFull,
    /// The node is said to have RDMA (feature `rdma`) and has no RDMA devices.
    Rdma,
    /// The node's `agent.memlock` allows the job's locked memory, but its shims cannot give
    /// it (the agent lacks CAP_SYS_RESOURCE).
    Memlock,
    /// The job's user, known to the controller, is unknown on the node (its user database).
    User,
    /// The job's supervisor could not be started, or the node's job directory not written.
    Supervisor,
    // The job's.
    /// The image does not exist (in the store, in the registry: MANIFEST_UNKNOWN).
    ImageNotFound,
    /// The image is malformed, or its reference or a SIF file is not usable by the user.
    ImageInvalid,
    /// The registry refused the image (DENIED, UNAUTHORIZED).
    ImageDenied,
    /// The command is missing from the image or not executable.
    Command,
    /// The working directory cannot be entered.
    Workdir,
    /// A `--mount` the node refuses or the user cannot reach.
    Mount,
    /// An output file the user cannot write.
    Output,
    /// The job asks for what this node does not offer (RDMA on a node without the feature,
    /// more locked memory than `agent.memlock`, root remapping under Docker).
    Unsupported,
    // Transient.
    /// The registry cannot be reached (or answered 5xx, or a download broke off).
    RegistryUnreachable,
    // The job's, last: what no other code says, and any code this version does not know.
    /// Not classified further: taken as the job's, which fails as before.
    #[serde(other)]
    Other,
}

impl FaultCode {
    /// Every code, in the order of the table in `docs/architecture.md`.
    pub const ALL: [FaultCode; 20] = [
        FaultCode::Cgroup,
        FaultCode::Namespaces,
        FaultCode::Sandbox,
        FaultCode::Device,
        FaultCode::ImageStore,
        FaultCode::DiskFull,
        FaultCode::Rdma,
        FaultCode::Memlock,
        FaultCode::User,
        FaultCode::Supervisor,
        FaultCode::ImageNotFound,
        FaultCode::ImageInvalid,
        FaultCode::ImageDenied,
        FaultCode::Command,
        FaultCode::Workdir,
        FaultCode::Mount,
        FaultCode::Output,
        FaultCode::Unsupported,
        FaultCode::RegistryUnreachable,
        FaultCode::Other,
    ];

    /// Whose fault a failure with this code is.
    pub fn kind(self) -> FaultKind {
        use FaultCode::*;
        match self {
            Cgroup | Namespaces | Sandbox | Device | ImageStore | DiskFull | Rdma | Memlock
            | User | Supervisor => FaultKind::Node,
            ImageNotFound | ImageInvalid | ImageDenied | Command | Workdir | Mount | Output
            | Unsupported | Other => FaultKind::Job,
            RegistryUnreachable => FaultKind::Transient,
        }
    }

    /// Its name on the wire (snake case).
    pub fn as_str(self) -> &'static str {
        use FaultCode::*;
        match self {
            Cgroup => "cgroup",
            Namespaces => "namespaces",
            Sandbox => "sandbox",
            Device => "device",
            ImageStore => "image_store",
            DiskFull => "disk_full",
            Rdma => "rdma",
            Memlock => "memlock",
            User => "user",
            Supervisor => "supervisor",
            ImageNotFound => "image_not_found",
            ImageInvalid => "image_invalid",
            ImageDenied => "image_denied",
            Command => "command",
            Workdir => "workdir",
            Mount => "mount",
            Output => "output",
            Unsupported => "unsupported",
            Other => "other",
            RegistryUnreachable => "registry_unreachable",
        }
    }

    /// The code of this name.
    pub fn parse(name: &str) -> Option<FaultCode> {
        FaultCode::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

impl std::fmt::Display for FaultCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified launch failure, carried in [`crate::ExitInfo::fault`] next to its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchFault {
    /// Whose fault: what the controller does about it.
    pub kind: FaultKind,
    /// The step that failed.
    pub code: FaultCode,
}

impl LaunchFault {
    /// The fault of `code`, of its own kind.
    pub fn new(code: FaultCode) -> LaunchFault {
        LaunchFault {
            kind: code.kind(),
            code,
        }
    }
}

impl From<FaultCode> for LaunchFault {
    fn from(code: FaultCode) -> Self {
        LaunchFault::new(code)
    }
}

impl std::fmt::Display for LaunchFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} fault: {}", self.kind, self.code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_have_one_name_each_and_read_back() {
        let mut names: Vec<&str> = FaultCode::ALL.iter().map(|c| c.as_str()).collect();
        for c in FaultCode::ALL {
            assert_eq!(FaultCode::parse(c.as_str()), Some(c));
            let json = serde_json::to_string(&c).unwrap();
            assert_eq!(json, format!("\"{}\"", c.as_str()));
        }
        names.sort();
        names.dedup();
        assert_eq!(names.len(), FaultCode::ALL.len());
    }

    #[test]
    fn node_steps_are_the_nodes_and_the_rest_the_jobs() {
        assert_eq!(FaultCode::Cgroup.kind(), FaultKind::Node);
        assert_eq!(FaultCode::Device.kind(), FaultKind::Node);
        assert_eq!(FaultCode::User.kind(), FaultKind::Node);
        assert_eq!(FaultCode::Command.kind(), FaultKind::Job);
        assert_eq!(FaultCode::ImageNotFound.kind(), FaultKind::Job);
        assert_eq!(FaultCode::Other.kind(), FaultKind::Job);
        assert_eq!(FaultCode::RegistryUnreachable.kind(), FaultKind::Transient);
    }

    #[test]
    fn a_newer_agents_unknown_values_read_as_a_job_fault() {
        let f: LaunchFault =
            serde_json::from_str(r#"{"kind":"planet","code":"cosmic_ray"}"#).unwrap();
        assert_eq!(f.kind, FaultKind::Job);
        assert_eq!(f.code, FaultCode::Other);
        let f: LaunchFault = serde_json::from_str(r#"{"kind":"node","code":"cgroup"}"#).unwrap();
        assert_eq!(f, LaunchFault::new(FaultCode::Cgroup));
    }
}
