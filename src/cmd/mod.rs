//! One module per command.

pub mod acct;
pub mod admin;
pub mod agent;
pub mod cancel;
pub mod controller;
pub mod dev;
pub mod eff;
pub mod hold;
pub mod image;
pub mod nodes;
pub mod prepull;
pub mod queue;
pub mod report;
pub mod requeue;
pub mod run;
pub mod share;
pub mod shim;
pub mod show;
pub mod srun;
pub mod step;
pub mod submit;
pub mod update;
