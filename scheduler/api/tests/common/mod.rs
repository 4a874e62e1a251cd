//! Helpers shared by the property tests.

use proptest::prelude::ProptestConfig;

/// 512 cases a property; `PROPTEST_CASES=N` runs more for a deeper search.
pub fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(512),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
