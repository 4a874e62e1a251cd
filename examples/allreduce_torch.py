#!/usr/bin/env python3
"""The same check as allreduce.py, through torch.distributed: gloo on the CPU (the default),
or NCCL on a GPU.

`init_process_group(BACKEND, init_method="env://")` reads MASTER_ADDR, MASTER_PORT, RANK and
WORLD_SIZE, exactly what Wharf gives every task of a job. Set GLOO_SOCKET_IFNAME (a node
default in the agent's `env`) when the host name does not resolve to the fabric address.
The backend is `--backend`, else $ALLREDUCE_BACKEND, else gloo. With NCCL each task uses the
GPU numbered LOCAL_RANK among those it sees, or its only one (`--gpus-per-task 1`).
Prints `allreduce ok rank=R world=W sum=S backend=B`, or exits 1 on a wrong sum.
"""

import argparse
import datetime
import os
import sys

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--length", type=int, default=100_000, help="elements per vector")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for the rendezvous")
    p.add_argument("--backend", choices=["gloo", "nccl"],
                   default=os.environ.get("ALLREDUCE_BACKEND", "gloo"),
                   help="torch.distributed backend (default: $ALLREDUCE_BACKEND, else gloo)")
    a = p.parse_args()
    device = torch.device("cpu")
    if a.backend == "nccl":
        count = torch.cuda.device_count()
        if count == 0:
            print("allreduce: the nccl backend needs a GPU and this task sees none",
                  file=sys.stderr, flush=True)
            sys.exit(2)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % count)
        torch.cuda.set_device(device)
    dist.init_process_group(
        a.backend, init_method="env://", timeout=datetime.timedelta(seconds=a.timeout)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    i = torch.arange(a.length, dtype=torch.int64)
    # Rank r's vector: element i is (r + 1) * (i + 1) + r * r, as in allreduce.py.
    vec = ((rank + 1) * (i + 1) + rank * rank).to(device)
    dist.all_reduce(vec, op=dist.ReduceOp.SUM)
    vec = vec.cpu()
    want = (i + 1) * (world * (world + 1) // 2) + (world - 1) * world * (2 * world - 1) // 6
    bad = (vec != want).nonzero()
    if len(bad):
        j = int(bad[0])
        print(f"allreduce: MISMATCH rank={rank} world={world} element {j}: got {int(vec[j])}, "
              f"want {int(want[j])}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"allreduce ok rank={rank} world={world} sum={int(vec.sum())} backend={a.backend}",
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
