#!/usr/bin/env python3
"""The same check as allreduce.py, through torch.distributed (gloo backend, CPU).

`init_process_group("gloo", init_method="env://")` reads MASTER_ADDR, MASTER_PORT, RANK and
WORLD_SIZE, exactly what Wharf gives every node of a job. Set GLOO_SOCKET_IFNAME (a node
default in the agent's `env`) when the host name does not resolve to the fabric address.
Prints `allreduce ok rank=R world=W sum=S backend=gloo`, or exits 1 on a wrong sum.
"""

import argparse
import datetime
import sys

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--length", type=int, default=100_000, help="elements per vector")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the rendezvous")
    a = p.parse_args()
    dist.init_process_group(
        "gloo", init_method="env://", timeout=datetime.timedelta(seconds=a.timeout)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    i = torch.arange(a.length, dtype=torch.int64)
    # Rank r's vector: element i is (r + 1) * (i + 1) + r * r, as in allreduce.py.
    vec = (rank + 1) * (i + 1) + rank * rank
    dist.all_reduce(vec, op=dist.ReduceOp.SUM)
    want = (i + 1) * (world * (world + 1) // 2) + (world - 1) * world * (2 * world - 1) // 6
    bad = (vec != want).nonzero()
    if len(bad):
        j = int(bad[0])
        print(f"allreduce: MISMATCH rank={rank} world={world} element {j}: got {int(vec[j])}, "
              f"want {int(want[j])}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"allreduce ok rank={rank} world={world} sum={int(vec.sum())} backend=gloo", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
