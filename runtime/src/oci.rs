//! ContainerSpec → OCI runtime spec (config.json). Pure: the result depends only on the input.

use std::path::Path;

use oci_spec::runtime::{get_default_maskedpaths, get_default_readonly_paths, Spec};
use serde_json::{json, Value};

use crate::error::{ErrorKind, RuntimeError};
use crate::spec::ContainerSpec;

/// Character devices every container may use (runc's default allow list): null, zero, full,
/// random, urandom, tty, ptmx and the pts devices.
const STANDARD_DEVICES: [(i64, Option<i64>); 8] = [
    (1, Some(3)),
    (1, Some(5)),
    (1, Some(7)),
    (1, Some(8)),
    (1, Some(9)),
    (5, Some(0)),
    (5, Some(2)),
    (136, None),
];

/// Builds the OCI spec for `spec`, joining the user namespace at `userns` (created and mapped
/// by the shim, see [`crate::userns`]). No capabilities, no_new_privs, deny-all device cgroup
/// plus the standard list, runc's masked and read-only paths, host network.
pub fn build_oci_spec(spec: &ContainerSpec, userns: &Path) -> Result<Spec, RuntimeError> {
    let mut devices = vec![json!({"allow": false, "access": "rwm"})];
    for (major, minor) in STANDARD_DEVICES {
        devices.push(
            json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"}),
        );
    }
    // Each allocated device by its own number: read and write, never mknod.
    for d in &spec.devices {
        devices.push(
            json!({"allow": true, "type": "c", "major": d.major, "minor": d.minor, "access": "rw"}),
        );
    }
    let mut resources = json!({ "devices": devices });
    if let Some(mem) = spec.memory {
        resources["memory"] = json!({ "limit": mem });
    }
    let mut cpu = serde_json::Map::new();
    if let Some(cpus) = spec.cpus {
        cpu.insert("quota".into(), json!(i64::from(cpus) * 100_000));
        cpu.insert("period".into(), json!(100_000u64));
    }
    if !spec.cpuset.is_empty() {
        let list: Vec<String> = spec.cpuset.iter().map(u32::to_string).collect();
        cpu.insert("cpus".into(), json!(list.join(",")));
    }
    if !cpu.is_empty() {
        resources["cpu"] = Value::Object(cpu);
    }
    if let Some(pids) = spec.pids {
        resources["pids"] = json!({ "limit": pids });
    }
    let no_caps: [&str; 0] = [];
    let caps = json!({
        "bounding": no_caps, "effective": no_caps, "inheritable": no_caps,
        "permitted": no_caps, "ambient": no_caps,
    });
    let mut groups = spec.groups.clone();
    groups.retain(|&g| g != spec.gid);
    let mut config = json!({
        "ociVersion": "1.0.2",
        "root": { "path": spec.rootfs, "readonly": !spec.writable },
        "hostname": spec.hostname,
        "process": {
            "terminal": false,
            "user": if spec.remap_root {
                json!({ "uid": 0, "gid": 0, "additionalGids": groups })
            } else {
                json!({ "uid": spec.uid, "gid": spec.gid, "additionalGids": groups })
            },
            "args": spec.argv,
            "env": spec.env,
            "cwd": spec.cwd,
            "capabilities": caps,
            "noNewPrivileges": true,
        },
        "mounts": mounts(spec),
        "linux": {
            "namespaces": [
                { "type": "user", "path": userns },
                { "type": "mount" },
                { "type": "pid" },
                { "type": "ipc" },
                { "type": "uts" },
            ],
            "cgroupsPath": spec.cgroup_path(),
            "resources": resources,
            "maskedPaths": get_default_maskedpaths(),
            "readonlyPaths": get_default_readonly_paths(),
        },
    });
    if let Some(profile) = crate::seccomp::profile() {
        config["linux"]["seccomp"] = profile;
    }
    serde_json::from_value(config)
        .map_err(|e| RuntimeError::new(ErrorKind::InvalidInput, format!("building OCI spec: {e}")))
}

/// Mounts of runc's default spec, adapted to a user namespace with the host network: no
/// `gid=`/`uid=` options (the ids are unmapped), the host's `/sys` bound read-only (a fresh
/// sysfs needs a network namespace of our own), a private `/tmp` and a sized `/dev/shm`.
fn mounts(spec: &ContainerSpec) -> Value {
    let mut mounts = base_mounts(spec);
    if let Value::Array(list) = &mut mounts {
        for b in &spec.binds {
            let mut options = vec!["rbind", "nosuid", "nodev"];
            if b.read_only {
                options.push("ro");
            }
            list.push(json!({ "destination": b.destination, "type": "bind", "source": b.source, "options": options }));
        }
        // Device nodes are bound one by one (mknod is impossible in a user namespace).
        for d in &spec.devices {
            list.push(
                json!({ "destination": d.path, "type": "bind", "source": d.host_path,
                              "options": ["bind", "nosuid", "noexec"] }),
            );
        }
    }
    mounts
}

fn base_mounts(spec: &ContainerSpec) -> Value {
    json!([
        { "destination": "/proc", "type": "proc", "source": "proc",
          "options": ["nosuid", "noexec", "nodev"] },
        { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
          "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
        { "destination": "/dev/pts", "type": "devpts", "source": "devpts",
          "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] },
        { "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
          "options": ["nosuid", "noexec", "nodev", "mode=1777", format!("size={}", spec.shm_size)] },
        { "destination": "/sys", "type": "bind", "source": "/sys",
          "options": ["rbind", "nosuid", "noexec", "nodev", "ro"] },
        { "destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
          "options": ["nosuid", "nodev", "mode=1777", format!("size={}", spec.tmp_size)] },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> ContainerSpec {
        let mut s = crate::conformance::template("wharf-1", Path::new("/images/x"), 1000, 1000);
        s.argv = vec!["/bin/true".into()];
        s.groups = vec![1000, 27];
        s.hostname = "n1".into();
        s.memory = Some(1 << 30);
        s.cpus = Some(2);
        s.cpuset = vec![0, 1];
        s.cgroup_parent = "wharf".into();
        s.devices = vec![crate::DeviceNode {
            host_path: "/fake/nvidia3".into(),
            path: "/dev/nvidia3".into(),
            major: 195,
            minor: 3,
        }];
        s
    }

    #[test]
    fn spec_is_locked_down() {
        let s = build_oci_spec(&sample(), Path::new("/proc/9/ns/user")).unwrap();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["process"]["noNewPrivileges"], true);
        for set in [
            "bounding",
            "effective",
            "permitted",
            "inheritable",
            "ambient",
        ] {
            assert_eq!(v["process"]["capabilities"][set], json!([]), "{set}");
        }
        assert_eq!(v["process"]["user"]["additionalGids"], json!([27]));
        assert_eq!(v["root"]["readonly"], true);
        let devs = &v["linux"]["resources"]["devices"];
        assert_eq!(devs[0], json!({"allow": false, "access": "rwm"}));
        assert_eq!(v["linux"]["resources"]["cpu"]["cpus"], "0,1");
        assert_eq!(v["linux"]["resources"]["cpu"]["quota"], 200000);
        assert_eq!(v["linux"]["cgroupsPath"], "/wharf/wharf-1");
        let ns: Vec<&str> = v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert_eq!(ns, ["user", "mount", "pid", "ipc", "uts"]);
        assert!(!v.to_string().contains("gid=5"));
        let last = devs.as_array().unwrap().last().unwrap();
        assert_eq!(
            last,
            &json!({"allow": true, "type": "c", "major": 195, "minor": 3, "access": "rw"})
        );
        let gpu = v["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/dev/nvidia3")
            .unwrap();
        assert_eq!(gpu["source"], "/fake/nvidia3");
    }
}
