#!/usr/bin/env python3
"""Compares the GPU inventory `wharf agent --probe --json` reports with `nvidia-smi -q -x`.

Used by tests/gpu-node.sh on a real GPU node. For every GPU nvidia-smi lists, the probe must
report the same device minor (the N of /dev/nvidiaN, Wharf's GPU id), UUID, model, PCI address,
NVML index (nvidia-smi's order) and total memory (nvidia-smi prints MiB, rounded down), and MIG
instances when MIG mode is on; and nothing more. Prints one line per GPU and each mismatch, and
exits 1 on any mismatch.

usage: gpu_inventory.py SMI_XML PROBE_JSON
"""

import json
import sys
import xml.etree.ElementTree as ET

MIB = 1 << 20


def kernel_bus(smi_bus):
    """nvidia-smi writes 00000000:3B:00.0; the kernel (and Wharf) 0000:3b:00.0."""
    bus = smi_bus.strip().lower()
    return bus[4:] if len(bus.split(":")[0]) == 8 else bus


def smi_gpus(path):
    root = ET.parse(path).getroot()
    gpus = []
    for order, g in enumerate(root.findall("gpu")):
        total = g.findtext("fb_memory_usage/total", "").split()
        mig_mode = g.findtext("mig_mode/current_mig", "N/A").strip()
        migs = g.findall("mig_devices/mig_device")
        gpus.append(
            {
                "order": order,
                "minor": int(g.findtext("minor_number")),
                "uuid": g.findtext("uuid").strip(),
                "model": g.findtext("product_name").strip(),
                "bus": kernel_bus(g.findtext("pci/pci_bus_id")),
                "memory_mib": int(total[0]) if total and total[0].isdigit() else None,
                "mig_on": mig_mode == "Enabled",
                "mig_count": len(migs),
            }
        )
    return gpus


def main():
    smi = smi_gpus(sys.argv[1])
    with open(sys.argv[2]) as f:
        probe = json.load(f)
    by_uuid = {g.get("uuid"): g for g in probe.get("gpus", [])}
    bad = []
    if len(probe.get("gpus", [])) != len(smi):
        bad.append(f"probe reports {len(probe.get('gpus', []))} GPUs, nvidia-smi {len(smi)}")
    for s in smi:
        p = by_uuid.get(s["uuid"])
        if p is None:
            bad.append(f"{s['uuid']}: not in the probe")
            continue
        mem = p.get("memory")
        print(
            f"nvidia-smi: minor {s['minor']} {s['uuid']} {s['model']} {s['bus']} "
            f"{s['memory_mib']} MiB | probe: /dev/nvidia{p.get('index')} nvml "
            f"{p.get('nvml_index')} {p.get('model')} {p.get('pci_bus')} "
            f"{None if mem is None else mem // MIB} MiB numa {p.get('numa_node')}"
        )
        checks = [
            ("device minor", p.get("index"), s["minor"]),
            ("NVML index", p.get("nvml_index"), s["order"]),
            ("model", p.get("model"), s["model"]),
            ("PCI address", p.get("pci_bus"), s["bus"]),
            ("memory (MiB)", None if mem is None else mem // MIB, s["memory_mib"]),
        ]
        if s["mig_on"]:
            checks.append(("MIG instances", len(p.get("mig", [])), s["mig_count"]))
        for what, got, want in checks:
            if got != want:
                bad.append(f"{s['uuid']}: {what}: probe {got!r}, nvidia-smi {want!r}")
    for line in bad:
        print("MISMATCH", line)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
