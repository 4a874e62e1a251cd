//! The conformance suite against the fake backend (needs no privileges).

use wharf_runtime::conformance::{run, template, Suite};
use wharf_runtime::fake::{FakeBackend, FakeCall};

#[test]
fn fake_backend_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let suite = Suite {
        dir: dir.path().to_path_buf(),
        template: template("fake", dir.path(), 1000, 1000),
    };
    let fake = FakeBackend::new();
    run(&fake, &suite);
    let calls = fake.calls();
    assert!(
        matches!(calls.first(), Some(FakeCall::Launch(id)) if id.starts_with("fake-true")),
        "{calls:?}"
    );
    assert!(calls.iter().any(|c| matches!(c, FakeCall::Cancel(_))));
}
