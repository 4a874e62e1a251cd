//! `wharf step` inside a job whose root is an image: the agent binds its own binary read-only
//! at `/usr/local/bin/wharf`, so an image without Wharf can still start steps.

use std::process::Command;
use std::time::Duration;

use crate::harness::*;

/// Imports an image of this machine's programs and the C libraries the `wharf` binary needs
/// (glibc 2.34 or later, as in any current distribution's image) as `name`.
fn import_glibc_image(c: &Cluster, name: &str) {
    let dir = scratch("wharf-steps-image");
    let rootfs = dir.path().join("rootfs");
    mkrootfs(
        &rootfs,
        &["sh", "cat", "echo", "grep", "touch", "sleep", "true"],
    );
    let ldd = Command::new("ldd").arg(wharf_bin()).output().unwrap();
    assert!(ldd.status.success(), "ldd {}: {ldd:?}", wharf_bin());
    for lib in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
    {
        let to = rootfs.join(lib.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        // Following symlinks, like mkrootfs.sh: the library itself at the path ldd named.
        std::fs::copy(lib, &to).unwrap_or_else(|e| panic!("{lib}: {e}"));
    }
    assert!(
        !rootfs.join("usr/local/bin/wharf").exists() && !rootfs.join("bin/wharf").exists(),
        "the image must not have wharf of its own"
    );
    c.import(&rootfs, name);
}

/// The mount options of the mount at `point` in a `/proc/self/mountinfo` text.
fn mount_options<'a>(mountinfo: &'a str, point: &str) -> Option<&'a str> {
    mountinfo.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(4) == Some(&point))
            .then(|| f.get(5).copied())
            .flatten()
    })
}

#[test]
fn wharf_step_runs_in_an_image_without_wharf_of_its_own() {
    let test = "wharf_step_runs_in_an_image_without_wharf_of_its_own";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    import_glibc_image(&c, "glibc");
    let alice = user("wharf-alice");
    let home = c.home(&alice);
    // The bare name, found on the job's PATH: the image has no wharf.
    let script = "command -v wharf; wharf step --ntasks-per-node 1 -- sh -c \
                  'echo STEP-IN-IMAGE step=$SLURM_STEP_ID'; \
                  echo RESULT STEP=$?";
    let id = submitted_id(&c.wharf_as(
        &alice,
        &[
            "submit", "--image", "glibc", "--mem", "128M", "-t", "1m", "--wrap", script,
        ],
    ));
    let job = c.wait_done(id, Duration::from_secs(60));
    let text = std::fs::read_to_string(home.join(format!("wharf-{id}.out"))).unwrap_or_default();
    assert_eq!(job["state"], "COMPLETED", "{job}\n{text}\n{}", c.log());
    assert!(text.contains("/usr/local/bin/wharf"), "{text}");
    assert!(text.contains("RESULT STEP=0"), "{text}\n{}", c.log());
    // The step's output came back to its caller, the batch command.
    assert!(text.contains("STEP-IN-IMAGE step=0"), "{text}");
    assert_eq!(job["steps"][0]["exit"]["code"], 0, "{job}");
}

#[test]
fn the_bound_wharf_binary_is_read_only_nosuid_and_nodev_even_in_a_writable_image() {
    let test = "the_bound_wharf_binary_is_read_only_nosuid_and_nodev_even_in_a_writable_image";
    if !can_run(test) {
        return;
    }
    let c = Cluster::start();
    import_glibc_image(&c, "glibc");
    let alice = user("wharf-alice");
    // Root inside a writable root may change the image's files (in its layer): a refusal
    // to write the binary is then the bind's, and its mount says ro, nosuid, nodev.
    let script = "grep ' /usr/local/bin/wharf ' /proc/self/mountinfo; \
                  if echo x >> /usr/local/bin/wharf; then echo RESULT BINARY=written; \
                  else echo RESULT BINARY=refused; fi; \
                  if echo x > /etc/mine; then echo RESULT LAYER=written; \
                  else echo RESULT LAYER=refused; fi";
    let out = c.run_sh(
        &alice,
        &[
            "--image",
            "glibc",
            "--writable",
            "--remap-root",
            "--mem",
            "64M",
        ],
        script,
    );
    let text = stdout(&out);
    assert!(
        text.contains("RESULT LAYER=written"),
        "{text}{}",
        stderr(&out)
    );
    assert!(
        text.contains("RESULT BINARY=refused"),
        "{text}{}",
        stderr(&out)
    );
    let options = mount_options(&text, "/usr/local/bin/wharf")
        .unwrap_or_else(|| panic!("no mount at /usr/local/bin/wharf:\n{text}"));
    let opts: Vec<&str> = options.split(',').collect();
    for want in ["ro", "nosuid", "nodev"] {
        assert!(opts.contains(&want), "{want} missing in {options}");
    }
}
