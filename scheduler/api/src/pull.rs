//! How far a node's pull of a job's registry image has come: reported by the agent with its
//! poll while the job is STARTING, kept by the controller in memory only, and shown by
//! `wharf show` (and `wharf queue`) until the job starts or ends.

use serde::{Deserialize, Serialize};

use crate::job::JobId;

/// One node's pull of one job's image. The bytes of a layer the node's store held already
/// count as done at once; those of the layers downloaded, as they arrive.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullProgress {
    /// The job.
    pub job: JobId,
    /// The node pulling. Empty in an agent's poll (the poll names its node); set in the
    /// controller's views of a job.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The image reference being pulled.
    pub image: String,
    /// Layers in the store so far.
    pub layers_done: u64,
    /// Layers of the image; 0 until its manifest is resolved.
    pub layers: u64,
    /// Compressed bytes done so far: of the layers kept, and downloaded.
    pub bytes_done: u64,
    /// Compressed bytes of all its layers; 0 until its manifest is resolved.
    pub bytes: u64,
}

impl PullProgress {
    /// Most entries one poll may carry (one per job being pulled on the node): beyond, the
    /// controller keeps none of them, so a broken agent cannot grow its memory.
    pub const MAX_PER_POLL: usize = 1024;
    /// Longest image reference kept (longer ones are cut).
    pub const MAX_IMAGE_LEN: usize = 1024;

    /// `pulling IMAGE: 2.1 of 8.4 GB, 3 of 14 layers` (`pulling IMAGE: resolving` before the
    /// manifest is known). Not escaped: callers that print it clean it.
    pub fn describe(&self) -> String {
        format!("pulling {}: {}", self.image, self.counts())
    }

    /// `2.1 of 8.4 GB, 3 of 14 layers`, or `resolving` before the manifest is known.
    pub fn counts(&self) -> String {
        if self.layers == 0 && self.bytes == 0 {
            return "resolving".into();
        }
        format!(
            "{}, {} of {} layers",
            bytes_of(self.bytes_done, self.bytes),
            self.layers_done,
            self.layers
        )
    }
}

/// `done` of `total` bytes in the unit of `total` (decimal, as registries and `docker pull`
/// count): `2.1 of 8.4 GB`, `512 of 900 kB`, `10 of 20 B`.
pub fn bytes_of(done: u64, total: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
        (1_000, "kB"),
    ];
    let Some((size, unit)) = UNITS.into_iter().find(|(size, _)| total >= *size) else {
        return format!("{done} of {total} B");
    };
    let one = |n: u64| {
        let v = n as f64 / size as f64;
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    };
    format!("{} of {} {unit}", one(done), one(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_shown_in_the_unit_of_the_total() {
        assert_eq!(bytes_of(2_100_000_000, 8_400_000_000), "2.1 of 8.4 GB");
        assert_eq!(bytes_of(0, 8_400_000_000), "0.0 of 8.4 GB");
        assert_eq!(bytes_of(512_000, 900_000), "512 of 900 kB");
        assert_eq!(bytes_of(10, 20), "10 of 20 B");
        assert_eq!(bytes_of(1_500_000, 1_500_000), "1.5 of 1.5 MB");
        assert_eq!(bytes_of(0, 0), "0 of 0 B");
    }

    #[test]
    fn a_pull_is_described_with_its_layers_once_resolved() {
        let mut p = PullProgress {
            job: 7,
            node: String::new(),
            image: "nvcr.io/nvidia/pytorch:24.05".into(),
            ..Default::default()
        };
        assert_eq!(
            p.describe(),
            "pulling nvcr.io/nvidia/pytorch:24.05: resolving"
        );
        p.layers = 14;
        p.layers_done = 3;
        p.bytes = 8_400_000_000;
        p.bytes_done = 2_100_000_000;
        assert_eq!(
            p.describe(),
            "pulling nvcr.io/nvidia/pytorch:24.05: 2.1 of 8.4 GB, 3 of 14 layers"
        );
        // An agent's entry carries no node; a view's does, and older readers ignore it.
        let json = serde_json::to_value(&p).unwrap();
        assert!(json.get("node").is_none());
        let back: PullProgress = serde_json::from_value(json).unwrap();
        assert_eq!(back, p);
    }
}
