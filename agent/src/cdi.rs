//! Container Device Interface (CDI) specs: how a node's GPU driver wants to be injected into
//! containers (device nodes, driver libraries and tools, environment), written by the vendor's
//! tooling (`nvidia-ctk cdi generate`) to `/etc/cdi` or `/var/run/cdi`. Wharf applies the
//! edits of the `nvidia.com/gpu` kind for exactly the GPUs a job was given, so the driver
//! libraries in the job always match the node's driver (Apptainer's `--nv` drift, avoided).
//! Hooks are not run: Wharf makes the mounts itself.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use wharf_api::node::GpuInfo;

/// The CDI kind of NVIDIA GPUs.
pub const GPU_KIND: &str = "nvidia.com/gpu";
/// Largest spec file read.
const MAX_SPEC_BYTES: u64 = 4 << 20;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    kind: String,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Edits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<DeviceNodeEdit>,
    #[serde(default)]
    mounts: Vec<MountEdit>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceNodeEdit {
    path: String,
    host_path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MountEdit {
    host_path: String,
    container_path: String,
    #[serde(default)]
    options: Vec<String>,
}

/// What a GPU job gets from the node's CDI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuEdits {
    /// Device nodes (host path, container path).
    pub device_nodes: Vec<(PathBuf, String)>,
    /// Driver files and directories, bound read-only unless the spec says `rw`.
    pub binds: Vec<wharf_runtime::Bind>,
    /// Environment, `NAME=value`.
    pub env: Vec<String>,
}

/// Finds the `nvidia.com/gpu` spec in `dirs` (the first in file-name order) and returns the
/// edits for `gpus`. A GPU is found under the name `nvidia-ctk cdi generate` gives it: its
/// UUID, else its NVML index (`"0"`, `"1"`, ...), else, where neither is known, its device
/// minor. `Ok(None)` when the node has no such spec; an error when a spec is broken or lacks
/// an allocated GPU.
pub fn gpu_edits(dirs: &[PathBuf], gpus: &[GpuInfo]) -> Result<Option<GpuEdits>, String> {
    let Some((file, spec)) = find(dirs)? else {
        return Ok(None);
    };
    let mut edits = GpuEdits::default();
    let mut apply = |e: &Edits| {
        edits.env.extend(e.env.iter().cloned());
        for d in &e.device_nodes {
            edits.device_nodes.push((
                PathBuf::from(d.host_path.as_deref().unwrap_or(&d.path)),
                d.path.clone(),
            ));
        }
        for m in &e.mounts {
            edits.binds.push(wharf_runtime::Bind {
                source: PathBuf::from(&m.host_path),
                destination: m.container_path.clone(),
                read_only: !m.options.iter().any(|o| o == "rw"),
                beneath: None,
            });
        }
    };
    apply(&spec.container_edits);
    for gpu in gpus {
        let names: Vec<String> = match (&gpu.uuid, gpu.nvml_index) {
            (None, None) => vec![gpu.index.to_string()],
            (uuid, index) => uuid
                .iter()
                .cloned()
                .chain(index.map(|i| i.to_string()))
                .collect(),
        };
        let dev = spec
            .devices
            .iter()
            .find(|d| names.contains(&d.name))
            .ok_or_else(|| {
                format!(
                    "{}: no CDI device {GPU_KIND}={} for allocated GPU {}",
                    file.display(),
                    names.join(" or "),
                    gpu.index
                )
            })?;
        apply(&dev.container_edits);
    }
    edits.device_nodes.sort();
    edits.device_nodes.dedup();
    Ok(Some(edits))
}

fn find(dirs: &[PathBuf]) -> Result<Option<(PathBuf, Spec)>, String> {
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|x| x == "json" || x == "yaml" || x == "yml")
            })
            .collect();
        files.sort();
        for f in files {
            let spec = read(&f)?;
            if spec.kind == GPU_KIND {
                return Ok(Some((f, spec)));
            }
        }
    }
    Ok(None)
}

fn read(f: &Path) -> Result<Spec, String> {
    let len = std::fs::metadata(f)
        .map_err(|e| format!("{}: {e}", f.display()))?
        .len();
    if len > MAX_SPEC_BYTES {
        return Err(format!(
            "{}: CDI spec larger than {MAX_SPEC_BYTES} bytes",
            f.display()
        ));
    }
    let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
    // `nvidia-ctk cdi generate` writes YAML unless asked for JSON.
    let parsed = if f.extension().is_some_and(|x| x == "json") {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        serde_yaml::from_str(&text).map_err(|e| e.to_string())
    };
    parsed.map_err(|e| format!("{}: not a CDI spec: {e}", f.display()))
}

/// Driver files to inject when a node has no CDI spec: NVIDIA's user-space libraries found in
/// `lib_dirs` and its tools in `bin_dirs`, each bound read-only at the same path.
pub fn discovered_driver_files(
    lib_dirs: &[PathBuf],
    bin_dirs: &[PathBuf],
) -> Vec<wharf_runtime::Bind> {
    const LIBS: [&str; 6] = [
        "libcuda.so",
        "libnvidia-",
        "libnvcuvid.so",
        "libnvoptix.so",
        "libcudadebugger.so",
        "libnvidia-ml.so",
    ];
    const BINS: [&str; 4] = [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
    ];
    let mut out = Vec::new();
    let mut scan = |dir: &Path, wanted: &dyn Fn(&str) -> bool| {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| wanted(n))
            .collect();
        names.sort();
        for n in names {
            let p = dir.join(&n);
            if p.is_file() {
                out.push(wharf_runtime::Bind {
                    source: p.clone(),
                    destination: p.display().to_string(),
                    read_only: true,
                    beneath: None,
                });
            }
        }
    };
    for d in lib_dirs {
        scan(d, &|n: &str| {
            LIBS.iter().any(|l| n.starts_with(l)) && n.contains(".so")
        });
    }
    for d in bin_dirs {
        scan(d, &|n: &str| BINS.contains(&n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"{
      "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
      "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}},
        {"name": "1", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": "/fake/nvidia1"}]}}
      ],
      "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [{"path": "/dev/nvidiactl"}],
        "mounts": [{"hostPath": "/usr/lib/libcuda.so.1", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]}]
      }
    }"#;

    #[test]
    fn edits_for_the_allocated_gpus_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia.json"), SPEC).unwrap();
        std::fs::write(
            dir.path().join("other.json"),
            r#"{"kind": "vendor.com/fpga"}"#,
        )
        .unwrap();
        let e = gpu_edits(&[dir.path().to_path_buf()], &[GpuInfo::minor(1)])
            .unwrap()
            .unwrap();
        assert_eq!(
            e.device_nodes,
            vec![
                (PathBuf::from("/dev/nvidiactl"), "/dev/nvidiactl".into()),
                (PathBuf::from("/fake/nvidia1"), "/dev/nvidia1".into())
            ]
        );
        assert_eq!(e.binds.len(), 1);
        assert!(e.binds[0].read_only);
        assert_eq!(e.env, vec!["NVIDIA_VISIBLE_DEVICES=void".to_string()]);
        let missing = gpu_edits(&[dir.path().to_path_buf()], &[GpuInfo::minor(5)]).unwrap_err();
        assert!(
            missing.contains("no CDI device nvidia.com/gpu=5"),
            "{missing}"
        );
        assert_eq!(
            gpu_edits(&[PathBuf::from("/nonexistent")], &[GpuInfo::minor(0)]).unwrap(),
            None
        );
        std::fs::write(dir.path().join("a-broken.json"), "{").unwrap();
        assert!(gpu_edits(&[dir.path().to_path_buf()], &[GpuInfo::minor(0)])
            .unwrap_err()
            .contains("not a CDI spec"));
    }

    #[test]
    fn yaml_specs_as_nvidia_ctk_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("nvidia.yaml"),
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\ncontainerEdits:\n  deviceNodes:\n  - path: /dev/nvidiactl\n  mounts:\n  - hostPath: /usr/lib/libcuda.so.1\n    containerPath: /usr/lib/libcuda.so.1\n    options: [ro, nosuid, nodev, bind]\n",
        )
        .unwrap();
        let e = gpu_edits(&[dir.path().to_path_buf()], &[GpuInfo::minor(0)])
            .unwrap()
            .unwrap();
        assert_eq!(
            e.device_nodes,
            vec![
                (PathBuf::from("/dev/nvidia0"), "/dev/nvidia0".into()),
                (PathBuf::from("/dev/nvidiactl"), "/dev/nvidiactl".into())
            ]
        );
        assert_eq!(e.binds.len(), 1);
        std::fs::write(dir.path().join("nvidia.yaml"), "kind: [").unwrap();
        assert!(gpu_edits(&[dir.path().to_path_buf()], &[GpuInfo::minor(0)])
            .unwrap_err()
            .contains("not a CDI spec"));
    }

    /// nvidia-ctk names each GPU by NVML index and by UUID. On a node whose NVML numbering
    /// differs from the device minors (minor 3 is NVML's 2), the allocated GPU's own entry
    /// is used, never the one that merely shares its number.
    #[test]
    fn gpus_are_found_by_uuid_or_nvml_index_not_by_device_minor() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("nvidia.json"),
            r#"{"kind": "nvidia.com/gpu", "containerEdits": {},
              "devices": [
                {"name": "2", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3"}]}},
                {"name": "3", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia4"}]}},
                {"name": "GPU-c", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia3"}]}}
              ]}"#,
        )
        .unwrap();
        let dirs = [dir.path().to_path_buf()];
        let by_index = GpuInfo {
            nvml_index: Some(2),
            ..GpuInfo::minor(3)
        };
        let by_uuid = GpuInfo {
            uuid: Some("GPU-c".into()),
            ..by_index.clone()
        };
        for gpu in [by_index, by_uuid] {
            let e = gpu_edits(&dirs, &[gpu]).unwrap().unwrap();
            assert_eq!(
                e.device_nodes,
                vec![(PathBuf::from("/dev/nvidia3"), "/dev/nvidia3".into())]
            );
        }
        let unknown = GpuInfo {
            uuid: Some("GPU-x".into()),
            nvml_index: Some(7),
            ..GpuInfo::minor(2)
        };
        let err = gpu_edits(&dirs, &[unknown]).unwrap_err();
        assert!(
            err.contains("nvidia.com/gpu=GPU-x or 7 for allocated GPU 2"),
            "{err}"
        );
    }
}
