"""A long fat network between two real hosts: a client namespace and a server namespace joined
by a user-space delay line (`blobstream bench delay-line`: this kernel has no netem), 25 ms
each way (50 ms round trip), a rate-limited bottleneck and 0.01 % random loss (fixed seed).
Driven by scripts/lfn-hosts, which the test suite runs (as root).

    near (client) ──TUN── delay line (root namespace) ──TUN── far (server)

Checks, each with the real `blobstream` processes:
  1. a put over the far link keeps the exact bytes;
  2. a get with --connections 4 keeps the exact bytes and says it used 4 connections; a get
     with no flag chooses several by itself (large blob, far server); a put over 4
     connections makes the exact blob;
  3. one range's connection killed mid-transfer (`ss -K`): that range continues on a new
     connection, the file is exact; the sender's side of each far data connection (the server
     for a get, the client for a put) has a send buffer sized past autotuning's cap;
  4. a get interrupted by Ctrl-C (SIGINT) mid-transfer resumes where its ranges stopped, and
     a `get -r` interrupted the same way finishes when run again;
Everything it creates (namespaces, TUN devices, processes, files) is removed on exit.

With --bench RUNS (used by `blobstream bench lfn`), it checks nothing: on a 1 Gbit/s link it
pulls and puts a 1 GiB blob RUNS times with 1, 2, 4 and 8 connections, moves the same 1 GiB
with iperf3 -P N both ways over the same link (-n 1G; and for N = 1, 2 also with
-w net.core.wmem_max, the largest send buffer a process may ask for without privileges), each
command timed from its start to its exit, and prints JSON with every rate (iperf3's own
data-phase figures too).
"""

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from netns import Lab

BIN = os.environ["BLOBSTREAM_BIN"]
TAG = f"bsl{os.getpid() % 100000}"
LAB = Lab(TAG, ["near", "far"])
DEV = {"near": f"{TAG}n", "far": f"{TAG}f"}
ADDR = {"near": "10.78.0.2", "far": "10.78.0.1"}
BENCH = "--bench" in sys.argv
# The checks run a debug build on a busy machine: a slower link keeps every transfer long
# enough to interrupt, and the delay line's CPU small.
RATE_MBIT = 1000 if BENCH else 300
DELAY_MS = 25
LOSS_PPM = 100
MTU = 9000
SERVER = f"{ADDR['far']}:7070"


sh, in_ns, check = LAB.sh, LAB.in_ns, LAB.check


def spawn(cmd, **kw):
    return LAB.track(
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw))


def setup(work):
    LAB.add()
    line = spawn([BIN, "bench", "delay-line", DEV["near"], DEV["far"], "--delay-ms",
                  str(DELAY_MS), "--rate-mbit", str(RATE_MBIT), "--loss-ppm", str(LOSS_PPM),
                  "--queue-ms", "50"])
    if line.stdout.readline().strip() != "ready":
        raise RuntimeError(f"delay line did not start: {line.stderr.read()}")
    for side in ["near", "far"]:
        dev = DEV[side]
        sh("ip", "link", "set", dev, "netns", LAB.ns[side])
        sh(*in_ns(side, "ip", "addr", "add", f"{ADDR[side]}/24", "dev", dev))
        sh(*in_ns(side, "ip", "link", "set", dev, "mtu", str(MTU), "up"))
        sh(*in_ns(side, "ip", "link", "set", "lo", "up"))
    data = os.path.join(work, "server")
    srv = spawn(in_ns("far", BIN, "serve", "--data", data, "--addr", SERVER, "--data-addr",
                      f"{ADDR['far']}:7071", "--no-http", "--no-samples", "--scrub-every", "0"))
    end = time.time() + 60
    while time.time() < end:
        if client("ls").returncode == 0:
            return srv
        if srv.poll() is not None:
            raise RuntimeError(f"server exited: {srv.stderr.read()}")
        time.sleep(0.1)
    raise RuntimeError("server did not answer within 60 s")


def client(*args):
    return subprocess.run(in_ns("near", BIN, "--server", SERVER, *args), capture_output=True,
                          text=True, timeout=600)


def client_bg(*args):
    return spawn(in_ns("near", BIN, "--server", SERVER, *args))


def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def data_connections(counter="bytes_received"):
    """The client's established connections to the data plane: {local port: bytes received}
    (or another of ss's counters: bytes_acked, what the server has of a put)."""
    r = sh(*in_ns("near", "ss", "-tniH", "state", "established", "dport", "=", ":7071"))
    conns, port = {}, None
    for line in r.stdout.splitlines():
        if ":7071" in line:
            port = line.split()[2].rsplit(":", 1)[1]
            conns[port] = 0
        elif port and (m := re.search(counter + r":(\d+)", line)):
            conns[port] = int(m.group(1))
    return conns


def send_buffers(side, match):
    """The send buffers (ss's skmem `tb`, bytes) of `side`'s established data connections
    (`match`: ss's filter, e.g. "sport = :7071")."""
    r = sh(*in_ns(side, "ss", "-tmH", "state", "established", *match.split()))
    return [int(m.group(1)) for m in re.finditer(r"\btb(\d+)", r.stdout)]


def far_send_buffer_ok(side, match):
    """Whether `side`'s data connections over the far link have the send buffer a far peer
    gets (crates/transport/src/far.rs): as root (this script), forced past net.core.wmem_max
    to twice MAX_SEND_BUFFER (64 MiB), when that is more than autotuning's cap
    (net.ipv4.tcp_wmem's maximum in the namespace), else autotuning's."""
    forced = 2 * (64 << 20)
    autotune = int(sh(*in_ns(side, "cat", "/proc/sys/net/ipv4/tcp_wmem")).stdout.split()[2])
    tbs = send_buffers(side, match)
    want = (lambda tb: tb == forced) if forced > autotune else (lambda tb: tb <= autotune)
    return bool(tbs) and all(want(tb) for tb in tbs), (tbs, forced, autotune)


def wait_for(pred, what, limit=120):
    end = time.time() + limit
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def ranges_done(path):
    """Bytes the ranges file of a parallel get says are in place."""
    try:
        with open(path) as f:
            return sum(int(line.split()[2]) for line in f.read().splitlines()[1:])
    except (OSError, ValueError, IndexError):
        return 0


def checks(work):
    size = 96 << 20
    src = os.path.join(work, "scan.bin")
    with open(src, "wb") as f:
        f.write(os.urandom(size))
    want = sha(src)

    # 1. A put over the far link.
    r = client("put", src, "far/scan.bin")
    check(r.returncode == 0, f"put over a 50 ms, {RATE_MBIT} Mbit/s link: {r.stderr.strip()}")

    # 2. Four connections asked, and chosen.
    out = os.path.join(work, "four.bin")
    r = client("get", "far/scan.bin", out, "--connections", "4")
    check(r.returncode == 0 and "over 4 connections" in r.stderr and sha(out) == want,
          f"get --connections 4 keeps the exact bytes: {r.stderr.strip()}")
    out = os.path.join(work, "auto.bin")
    r = client("get", "far/scan.bin", out)
    check(r.returncode == 0 and "over 4 connections" in r.stderr and sha(out) == want,
          f"get chooses 4 connections for a far server by itself: {r.stderr.strip()}")

    # 2b. A put over four connections: one upload, committed once its digest checks out.
    r = client("put", src, "far/four.bin", "--connections", "4")
    check(r.returncode == 0 and "over 4 connections" in r.stderr,
          f"put --connections 4: {r.stderr.strip()}")
    out = os.path.join(work, "four-back.bin")
    r = client("get", "far/four.bin", out)
    check(r.returncode == 0 and sha(out) == want, "the blob put over 4 connections is exact")

    # 3. One range's connection killed mid-transfer.
    out = os.path.join(work, "cut.bin")
    p = client_bg("get", "far/scan.bin", out, "--connections", "4")
    # Four connections, each well into its range (not still being admitted, which a client
    # retries by itself before the range starts).
    wait_for(lambda: sum(n > (2 << 20) for n in data_connections().values()) == 4 or
             p.poll() is not None, "4 data connections under way")
    ports = list(data_connections())
    # The server sends: its connections to a far client get the larger send buffer.
    ok, seen = far_send_buffer_ok("far", "sport = :7071")
    check(ok, f"the server's send buffers on the far link are sized for it (tb, forced, "
              f"tcp_wmem max): {seen}")
    killed = len(ports) == 4 and sh(*in_ns("near", "ss", "-K", "-tn", "sport", "=",
                                         f":{ports[0]}", "dport", "=", ":7071")).returncode == 0
    _, err = p.communicate(timeout=300)
    check(killed, "one of the four range connections was killed mid-transfer")
    check(p.returncode == 0 and "1 reconnected" in err and sha(out) == want,
          f"the killed range continued on a new connection, the file is exact: {err.strip()}")

    # 4. Ctrl-C mid-transfer, then the same command again.
    out = os.path.join(work, "interrupted.bin")
    p = client_bg("get", "far/scan.bin", out, "--connections", "4")
    wait_for(lambda: ranges_done(out + ".blobstream-ranges") > 0 or p.poll() is not None,
             "the ranges file to record progress")
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    check(p.returncode != 0 and not os.path.exists(out), "Ctrl-C stopped the get, no file yet")
    r = client("get", "far/scan.bin", out, "--connections", "4")
    m = re.search(r"(\d+) bytes kept from the interrupted copy", r.stderr)
    check(r.returncode == 0 and m is not None and int(m.group(1)) > 0 and sha(out) == want,
          f"the get run again resumed its ranges, the file is exact: {r.stderr.strip()}")

    # 4b. Ctrl-C a put over four connections mid-way, then the same command again: each
    # range keeps what the server holds of it (checked by digest) and continues from there.
    p = client_bg("put", src, "far/interrupted.bin", "--connections", "4")
    wait_for(lambda: sum(n > (4 << 20) for n in data_connections("bytes_acked").values()) == 4
             or p.poll() is not None, "4 range pushes well under way")
    ok, seen = far_send_buffer_ok("near", "dport = :7071")
    check(ok, f"the client's send buffers on the far link are sized for it (tb, forced, "
              f"tcp_wmem max): {seen}")
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    check(p.returncode != 0, "Ctrl-C stopped the put over four connections")
    r = client("put", src, "far/interrupted.bin", "--connections", "4")
    m = re.search(r"(\d+) bytes kept from the interrupted copy", r.stderr)
    back = os.path.join(work, "interrupted-put.bin")
    g = client("get", "far/interrupted.bin", back)
    check(r.returncode == 0 and m is not None and int(m.group(1)) > 0 and
          g.returncode == 0 and sha(back) == want,
          f"the put run again kept the ranges' bytes the server held, the blob is exact: "
          f"{r.stderr.strip()}")

    study = os.path.join(work, "study")
    os.makedirs(study)
    for i in range(40):
        with open(os.path.join(study, f"{i:03}.dcm"), "wb") as f:
            f.write(os.urandom(1 << 20))
    r = client("put", "-r", study, "far/study/")
    check(r.returncode == 0, f"put -r of 40 files: {r.stderr.strip()}")
    here = os.path.join(work, "here")
    p = client_bg("get", "-r", "far/study/", here, "--jobs", "2")
    wait_for(lambda: (os.path.isdir(here) and len(os.listdir(here)) >= 4) or
             p.poll() is not None, "get -r to be under way")
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=60)
    partial = len([n for n in os.listdir(here) if n.endswith(".dcm")])
    r = client("get", "-r", "far/study/", here, "--json")
    same = all(sha(os.path.join(here, n)) == sha(os.path.join(study, n))
               for n in os.listdir(study))
    check(p.returncode != 0 and partial < 40, f"Ctrl-C stopped get -r after {partial} of 40 files")
    check(r.returncode == 0 and same and len(os.listdir(here)) == 40,
          f"get -r run again finished the folder, every file exact: {r.stdout.strip()[:300]}")


def bench(work, runs):
    size = 1 << 30
    src = os.path.join(work, "big.bin")
    with open(src, "wb") as f:
        for _ in range(size >> 24):
            f.write(os.urandom(1 << 24))
        # On disk now: else the kernel writes this gigabyte out in the middle of a timed
        # transfer (30 s after it was written), competing with the transfer's own writes.
        f.flush()
        os.fsync(f.fileno())
    r = client("put", src, "far/big.bin")
    if r.returncode != 0:
        raise RuntimeError(f"put failed: {r.stderr}")
    result = {"link_mbit": RATE_MBIT, "rtt_ms": 2 * DELAY_MS, "loss_ppm": LOSS_PPM,
              "bytes": size, "blobstream_mbit": {}, "iperf3_mbit": {},
              "put_mbit": {}, "iperf3_up_mbit": {}}
    out = os.path.join(work, "out.bin")

    # iperf3 -w N: the largest socket buffer an unprivileged process may ask for (iperf3's
    # default is autotuning; ours, as root here, go past it: crates/transport/src/far.rs).
    window = int(open("/proc/sys/net/core/wmem_max").read())
    result["iperf3_window"] = window
    for k in ["iperf3_w_mbit", "iperf3_up_w_mbit"]:
        result[k] = {}

    def iperf(n, reverse, w=False):
        if not shutil.which("iperf3"):
            return None
        srv = spawn(in_ns("far", "iperf3", "-s", "-1", "-B", ADDR["far"]))
        # Ready when its port listens (not after a guessed pause).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            ss = subprocess.run(in_ns("far", "ss", "-ltnH", "sport = :5201"),
                                capture_output=True, text=True)
            if ss.stdout.strip():
                break
            time.sleep(0.02)
        # The same work as ours, timed the same way: 1 GiB (-n takes 1G as 2^30 bytes), from
        # the process's start to its exit. Its own figure (the data phase only) is kept too.
        args = ["-c", ADDR["far"], "-P", str(n), "-n", "1G", "-J"] + (["-R"] if reverse else [])
        args += ["-w", str(window)] if w else []
        t = time.monotonic()
        r = subprocess.run(in_ns("near", "iperf3", *args), capture_output=True, text=True)
        secs = time.monotonic() - t
        if r.returncode != 0:
            srv.kill()
            srv.wait()
            return None
        srv.wait(timeout=30)
        end = json.loads(r.stdout)["end"]
        # iperf3 ends once its sender has written the last byte: its receiver's count may
        # miss what was still on the way (which only shortens iperf3's time).
        if end["sum_sent"]["bytes"] < size:
            raise RuntimeError(f"iperf3 -n 1G sent {end['sum_sent']['bytes']} bytes")
        return size * 8 / secs / 1e6, end["sum_received"]["bits_per_second"] / 1e6

    def timed(*args):
        t = time.monotonic()
        r = client("-q", *args)
        secs = time.monotonic() - t
        if r.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {r.stderr}")
        return size * 8 / secs / 1e6

    for n in [1, 2, 4, 8]:
        down, up, iperf_down, iperf_up = [], [], [], []
        # With one or two streams the socket buffer bounds iperf3's rate: also with -w.
        windowed = n <= 2
        w_down, w_up = [], []
        for _ in range(runs):
            if os.path.exists(out):
                os.remove(out)
            down.append(timed("get", "far/big.bin", out, "--connections", str(n), "--no-resume"))
            iperf_down.append(iperf(n, True))
            # One key, replaced each time: the server keeps one copy, not one per run.
            up.append(timed("put", src, "far/up.bin", "--connections", str(n), "--overwrite"))
            iperf_up.append(iperf(n, False))
            if windowed:
                w_down.append(iperf(n, True, w=True))
                w_up.append(iperf(n, False, w=True))
        result["blobstream_mbit"][str(n)] = down
        result["put_mbit"][str(n)] = up
        # Each iperf3 key: the rates timed as ours are; with "_own", iperf3's own figures.
        for key, runs_of in [("iperf3_mbit", iperf_down), ("iperf3_up_mbit", iperf_up)] + (
                [("iperf3_w_mbit", w_down), ("iperf3_up_w_mbit", w_up)] if windowed else []):
            done = [x for x in runs_of if x is not None]
            result[key][str(n)] = [wall for wall, _ in done]
            result.setdefault(key + "_own", {})[str(n)] = [own for _, own in done]
    print(json.dumps(result))


def main():
    work = tempfile.mkdtemp(prefix="bs-lfn-hosts-")
    try:
        setup(work)
        if BENCH:
            return bench(work, int(sys.argv[sys.argv.index("--bench") + 1]))
        checks(work)
    finally:
        LAB.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    LAB.finish("lfn-hosts")


if __name__ == "__main__":
    main()
