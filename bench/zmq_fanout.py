"""ZeroMQ PUB/SUB moving the same bytes as `blobstream bench fanout`: the baseline.

usage: zmq_fanout.py RECEIVERS TOTAL_BYTES MESSAGE_BYTES RUNS

The messages are consecutive slices of a 64 MiB buffer, sent without a copy (as the distributer
sends its 64 MiB payload in chunks): each run moves distinct bytes, as an instrument's stream
does, not one message resent from the cache.

One publisher (this process) and RECEIVERS subscriber processes on 127.0.0.1. No drops: high
water marks are 0 (unbounded queues), and every subscriber confirms the exact byte count of
each run before the run's clock stops. Subscribers join and confirm through a PULL socket,
so the slow-joiner problem cannot lose the first messages: the publisher sends warm-up
messages until every subscriber has seen one. Prints JSON: aggregate delivered Gbit/s per run.
"""

import json
import multiprocessing as mp
import sys
import time

import zmq


def subscriber(pub_port, ctl_port, ident):
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{pub_port}")
    ctl = ctx.socket(zmq.PUSH)
    ctl.connect(f"tcp://127.0.0.1:{ctl_port}")
    ready = False
    got = 0
    while True:
        m = sub.recv(copy=False)
        b = m.buffer
        if len(b) == 1:
            kind = bytes(b)
            if kind == b"W":
                if not ready:
                    ready = True
                    ctl.send(f"ready {ident}".encode())
            elif kind == b"E":
                ctl.send(f"done {ident} {got}".encode())
                got = 0
            elif kind == b"Q":
                return
        else:
            got += len(b)


def main():
    n, total, size, runs = (int(a) for a in sys.argv[1:5])
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    ctl = ctx.socket(zmq.PULL)
    ctl_port = ctl.bind_to_random_port("tcp://127.0.0.1")
    procs = [mp.Process(target=subscriber, args=(pub_port, ctl_port, i)) for i in range(n)]
    for p in procs:
        p.start()
    ready = set()
    while len(ready) < n:
        pub.send(b"W")
        while ctl.poll(10):
            ready.add(ctl.recv().split()[1])
    span = max(size, (64 << 20) // size * size)
    payload = memoryview(bytes(range(256)) * (span // 256) + bytes(span % 256))
    slices = [payload[i : i + size] for i in range(0, span, size)]
    count = total // size
    rates = []
    for _ in range(runs):
        t = time.perf_counter()
        for i in range(count):
            pub.send(slices[i % len(slices)], copy=False)
        pub.send(b"E")
        done = 0
        for _ in range(n):
            parts = ctl.recv().split()
            if parts[0] != b"done":
                continue
            got = int(parts[2])
            if got != count * size:
                print(json.dumps({"error": f"a subscriber got {got} of {count * size} bytes"}))
                sys.exit(1)
            done += got
        secs = time.perf_counter() - t
        rates.append(done * 8 / secs / 1e9)
    pub.send(b"Q")
    for p in procs:
        p.join()
    print(json.dumps({"gbit_per_s": rates}))


if __name__ == "__main__":
    main()
