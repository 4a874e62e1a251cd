//! The dependency rules of docs/architecture.md, checked on the real dependency graph.

use std::process::Command;

fn deps(package: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "--locked",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--format",
            "{p}",
            "-p",
            package,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn scheduler_core_does_no_io() {
    let d = deps("wharf-core");
    for banned in [
        "tokio",
        "rusqlite",
        "postgres",
        "tokio-postgres",
        "axum",
        "hyper",
        "libcontainer",
        "reqwest",
        "anyhow",
    ] {
        assert!(
            !d.iter().any(|p| p == banned),
            "wharf-core depends on {banned}: {d:?}"
        );
    }
}

#[test]
fn api_types_are_serde_only() {
    let d = deps("wharf-api");
    for banned in [
        "tokio",
        "rusqlite",
        "postgres",
        "tokio-postgres",
        "axum",
        "hyper",
        "anyhow",
    ] {
        assert!(
            !d.iter().any(|p| p == banned),
            "wharf-api depends on {banned}"
        );
    }
}

#[test]
fn agent_never_depends_on_the_scheduler_core() {
    assert!(!deps("wharf-agent").iter().any(|p| p == "wharf-core"));
}

#[test]
fn only_binaries_use_anyhow() {
    for lib in [
        "wharf-api",
        "wharf-core",
        "wharf-client",
        "wharf-controller",
        "wharf-agent",
        "wharf-runtime",
        "wharf-images",
    ] {
        assert!(
            !deps(lib).iter().any(|p| p == "anyhow"),
            "{lib} depends on anyhow"
        );
    }
}
