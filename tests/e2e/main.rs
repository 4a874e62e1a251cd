//! End-to-end tests of the `wharf` binary: real daemons, real sandboxes, real users.
//!
//! They need root (the agent creates namespaces and cgroups; users are made with `useradd`).
//! Without root they fail under `WHARF_TEST_STRICT=1` (CI) and skip with a printed reason
//! otherwise.

mod acct;
mod admin;
mod agent_reports;
mod cancel_filters;
mod cancel_signal;
mod closed_pipe;
mod connections;
mod durability;
mod faults;
mod flags;
mod gang;
mod gang_preflight;
mod gpu;
mod harness;
mod images;
mod images_nodes;
mod images_registry;
mod job_files;
mod job_forms;
mod jobfile;
mod lifecycle;
#[path = "../../images/tests/common/loopback.rs"]
mod loopback;
mod multihost;
mod netns;
mod node_selection;
mod options;
mod preemption;
mod preflight;
mod recovery;
mod remote;
mod rendezvous;
mod run_signals;
mod sandbox;
mod scheduling;
mod sif;
mod sif_fifo;
mod sinfo;
mod state_files;
mod steps;
mod steps_gpus;
mod steps_image;
mod steps_input;
mod steps_memory;
mod steps_output;
mod submit_limits;
mod tasks;
mod untrusted_text;
mod usage;
mod user_paths;
mod waits;
