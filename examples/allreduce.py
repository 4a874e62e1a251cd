#!/usr/bin/env python3
"""A real ring all-reduce over TCP, with nothing but the rendezvous environment.

Every rank reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (what Wharf gives each node of
a job, whatever the image), and:

1. bootstraps as NCCL and gloo do: rank 0 listens on MASTER_ADDR:MASTER_PORT, every other
   rank connects to it (retrying until the deadline: rank 0 may start last) and tells it the
   address and port of its own ring listener; rank 0 sends everyone the table;
2. connects to its right neighbour and accepts its left one, so every pair of adjacent ranks
   talks directly, not through rank 0;
3. all-reduces a vector that depends on its rank, ring style (reduce-scatter, then
   all-gather, one chunk per rank);
4. checks every element against the closed form and prints
   `allreduce ok rank=R world=W sum=S addr=A` (A: the address its peers reached it at), or
   says what differs and exits 1. Any other failure (a timeout, a peer gone) exits 2.

Python 3 standard library only. Usage: allreduce.py [--length N] [--timeout SECONDS]
"""

import argparse
import array
import json
import os
import socket
import struct
import sys
import threading
import time


def fail(code, msg):
    print(f"allreduce: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def env_int(name):
    value = os.environ.get(name)
    if value is None:
        fail(2, f"{name} is not set (this program runs under a rendezvous: MASTER_ADDR, "
                "MASTER_PORT, RANK, WORLD_SIZE)")
    try:
        return int(value)
    except ValueError:
        fail(2, f"{name}={value!r} is not a number")


def send_frame(sock, payload):
    sock.sendall(struct.pack("!Q", len(payload)) + payload)


def recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock, limit=1 << 30):
    (n,) = struct.unpack("!Q", recv_exact(sock, 8))
    if n > limit:
        raise ConnectionError(f"frame of {n} bytes is over the limit")
    return recv_exact(sock, n)


def connect(host, port, deadline, timeout):
    """Connects to host:port, retrying while it refuses or is unreachable, until deadline."""
    last = None
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.settimeout(timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as e:
            last = e
            time.sleep(0.2)
    raise TimeoutError(f"could not connect to {host}:{port} before the deadline: {last}")


def listener(host, port, backlog):
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


def accept(lsock, deadline):
    lsock.settimeout(max(0.1, deadline - time.monotonic()))
    sock, _ = lsock.accept()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def bootstrap(addr, port, rank, world, deadline, timeout):
    """Returns (ring listener, this rank's reachable address, table of (host, port) by rank)."""
    if rank == 0:
        master = listener(addr, port, world)
        ring = listener(addr, 0, 2)
        table = [None] * world
        table[0] = (addr, ring.getsockname()[1])
        peers = []
        while len(peers) < world - 1:
            sock = accept(master, deadline)
            sock.settimeout(timeout)
            hello = json.loads(recv_frame(sock, 1 << 16))
            r = hello.get("rank")
            if hello.get("world") != world:
                raise ValueError(f"rank {r} says WORLD_SIZE={hello.get('world')}, rank 0 has {world}")
            if not isinstance(r, int) or not 0 < r < world or table[r] is not None:
                raise ValueError(f"a peer claims rank {r!r}, which is out of range or taken")
            table[r] = (hello["host"], hello["port"])
            peers.append(sock)
        reply = json.dumps(table).encode()
        for sock in peers:
            send_frame(sock, reply)
            sock.close()
        master.close()
        return ring, addr, table
    sock = connect(addr, port, deadline, timeout)
    # The address this host reaches rank 0 from is the one its peers can reach it at.
    host = sock.getsockname()[0]
    ring = listener(host, 0, 2)
    hello = {"rank": rank, "world": world, "host": host, "port": ring.getsockname()[1]}
    send_frame(sock, json.dumps(hello).encode())
    table = [tuple(p) for p in json.loads(recv_frame(sock, 1 << 20))]
    sock.close()
    return ring, host, table


def chunks(length, world):
    """Bounds of the world's chunks of a vector of `length` elements."""
    base, extra = divmod(length, world)
    bounds, start = [], 0
    for i in range(world):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def ring_allreduce(vec, rank, world, right, left):
    """Sums `vec` in place across the ring: reduce-scatter, then all-gather."""
    bounds = chunks(len(vec), world)

    def exchange(send_idx, recv_idx):
        lo, hi = bounds[send_idx]
        out = vec[lo:hi].tobytes()
        # Send while receiving: every rank sends at once, so sending first would deadlock
        # once a chunk is larger than the socket buffers.
        errors = []

        def sender():
            try:
                send_frame(right, out)
            except OSError as e:
                errors.append(e)

        t = threading.Thread(target=sender)
        t.start()
        got = array.array("q")
        got.frombytes(recv_frame(left))
        t.join()
        if errors:
            raise errors[0]
        lo, hi = bounds[recv_idx]
        if len(got) != hi - lo:
            raise ValueError(f"chunk {recv_idx} has {len(got)} elements, not {hi - lo}")
        return got, lo

    for step in range(world - 1):
        got, lo = exchange((rank - step) % world, (rank - step - 1) % world)
        for i, v in enumerate(got):
            vec[lo + i] += v
    for step in range(world - 1):
        got, lo = exchange((rank - step + 1) % world, (rank - step) % world)
        vec[lo:lo + len(got)] = got


def contribution(rank, length):
    """Rank r's vector: element i is (r + 1) * (i + 1) + r * r."""
    return array.array("q", ((rank + 1) * (i + 1) + rank * rank for i in range(length)))


def expected(i, world):
    """Element i of the sum over ranks 0..world-1 of `contribution`."""
    return (i + 1) * world * (world + 1) // 2 + (world - 1) * world * (2 * world - 1) // 6


def main():
    p = argparse.ArgumentParser(description="Ring all-reduce over TCP from MASTER_ADDR, "
                                "MASTER_PORT, RANK and WORLD_SIZE.")
    p.add_argument("--length", type=int, default=100_000, help="elements per vector")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds for the whole rendezvous and for each receive")
    a = p.parse_args()
    addr = os.environ.get("MASTER_ADDR") or fail(2, "MASTER_ADDR is not set")
    port, rank, world = env_int("MASTER_PORT"), env_int("RANK"), env_int("WORLD_SIZE")
    if world < 1 or not 0 <= rank < world:
        fail(2, f"RANK={rank} is not within WORLD_SIZE={world}")
    if a.length < 1:
        fail(2, "--length must be at least 1")
    deadline = time.monotonic() + a.timeout
    vec = contribution(rank, a.length)
    me = addr
    try:
        if world > 1:
            ring, me, table = bootstrap(addr, port, rank, world, deadline, a.timeout)
            right_host, right_port = table[(rank + 1) % world]
            # The right neighbour listens already (it sent its port before the table came),
            # so connecting first cannot wait on an accept.
            right = connect(right_host, right_port, deadline, a.timeout)
            left = accept(ring, deadline)
            left.settimeout(a.timeout)
            ring.close()
            ring_allreduce(vec, rank, world, right, left)
            right.close()
            left.close()
    except (OSError, ValueError, TimeoutError) as e:
        fail(2, f"rank {rank} of {world}: {e}")
    for i, got in enumerate(vec):
        want = expected(i, world)
        if got != want:
            fail(1, f"MISMATCH rank={rank} world={world} element {i}: got {got}, want {want}")
    print(f"allreduce ok rank={rank} world={world} sum={sum(vec)} addr={me}", flush=True)


if __name__ == "__main__":
    main()
