//! Wire and domain types shared by the CLI, the controller and the agent.
//!
//! This crate is serde only: no IO, no async runtime, no clock. Everything that crosses a
//! process boundary (the `/v1` HTTP API, the agent protocol, the job file) is defined here, so
//! the three programs cannot disagree about it.

pub mod admin;
pub mod alloc;
pub mod array;
pub mod dependency;
pub mod fault;
pub mod features;
pub mod forms;
pub mod hostlist;
pub mod image_ref;
pub mod job;
pub mod jobfile;
pub mod limits;
pub mod listing;
pub mod node;
pub mod pattern;
pub mod pending;
pub mod prepull;
pub mod pull;
pub mod report;
pub mod resources;
pub mod share;
pub mod signal;
pub mod step;
pub mod step_input;
pub mod step_output;
pub mod text;
pub mod usage;
pub mod wire;

pub use alloc::NodeAlloc;
pub use fault::{FaultCode, FaultKind, LaunchFault};
pub use forms::{Begin, Hold};
pub use job::{
    ExitInfo, JobDefaults, JobId, JobRecord, JobRequest, JobSpec, JobState, Owner, PriorityView,
    Stop,
};
pub use node::{NodeInfo, NodeRecord, NodeState};
pub use pull::PullProgress;
pub use resources::{
    parse_duration, parse_duration_or_zero, parse_memory, parse_time_limit, Resources,
    UNLIMITED_TIME,
};
