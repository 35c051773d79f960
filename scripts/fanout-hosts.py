"""The distributer across real hosts: network namespaces joined by veth pairs (MTU 9000), the
receivers' links shaped with tc tbf. Driven by scripts/fanout-hosts, which the test suite runs
(as root).

    sender ──veth── distributer ──veth (tbf 200 Mbit/s)── fast1
                                ──veth (tbf 200 Mbit/s)── fast2
                                ──veth (tbf 100 Mbit/s)── far

(No added delay: this machine's kernel has no netem, CONFIG_NET_SCH_NETEM is not set, so the
"far" receiver is the one behind the slower link.)

Checks, each with the real `blobstream` processes:
  1. every receiver keeps the exact file (hold policy), reported ok by the sender;
  2. a receiver frozen with SIGSTOP under the timeout policy is dropped and reported by name,
     the others complete;
  3. a receiver killed mid-run under hold: reported, the others complete;
  4. a sender killed mid-run: every receiver's run fails and nothing of it is kept;
  5. a udp flow paced at 150 Mbit/s: the two receivers behind 200 Mbit/s links keep the exact
     file; the one behind 100 Mbit/s loses datagrams at its link's queue (real loss, not a
     simulated one), and the sender reports it by name with the datagrams it lost;
  6. the sender as its own distributer (`send --serve`, on the distributer's host): it waits
     for the three receivers, and each keeps the exact file.
Prints each receiver's achieved rate against its link (information, not an assertion).
Everything it creates (namespaces, processes, files) is removed on exit.

With --bench RUNS (used by `blobstream bench fanout`), it checks nothing: every receiver's link
is 200 Mbit/s, and it prints JSON with each receiver's rate in each run (96 MiB under `hold`,
timed by the receiver from its start to its verified stop, the files in tmpfs so no disk
paces it) and iperf3's rate over one of the same links (if iperf3 is installed).
"""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from netns import Lab

BIN = os.environ["BLOBSTREAM_BIN"]
TAG = f"bsf{os.getpid() % 100000}"
LAB = Lab(TAG, ["snd", "dist", "fast1", "fast2", "far"])
NS = LAB.ns
RATE = "200mbit"
FAR_RATE = "100mbit"
PROCS = LAB.procs
BENCH = "--bench" in sys.argv
RUN_BYTES = 96 << 20
MTU = 9000


sh, in_ns, check, cleanup = LAB.sh, LAB.in_ns, LAB.check, LAB.cleanup


def setup():
    LAB.add()
    far = RATE if BENCH else FAR_RATE
    links = [("snd", 0, None), ("fast1", 1, RATE), ("fast2", 2, RATE), ("far", 3, far)]
    for peer, i, rate in links:
        a, b = f"{TAG}a{i}", f"{TAG}b{i}"
        sh("ip", "link", "add", a, "netns", NS[peer], "type", "veth", "peer", "name", b,
           "netns", NS["dist"])
        sh(*in_ns(peer, "ip", "addr", "add", f"10.77.{i}.1/30", "dev", a))
        sh(*in_ns("dist", "ip", "addr", "add", f"10.77.{i}.2/30", "dev", b))
        # Jumbo frames, as on a data centre's links: with 1500-byte frames TCP's headers
        # alone cap any stream at 0.956 of a tbf rate (1448 payload bytes per 1514 on the wire).
        sh(*in_ns(peer, "ip", "link", "set", a, "mtu", str(MTU)))
        sh(*in_ns("dist", "ip", "link", "set", b, "mtu", str(MTU)))
        sh(*in_ns(peer, "ip", "link", "set", a, "up"))
        sh(*in_ns(peer, "ip", "link", "set", "lo", "up"))
        sh(*in_ns("dist", "ip", "link", "set", b, "up"))
        if rate:
            # The distributer's side of each receiver's link: its egress is what the receiver
            # gets.
            sh(*in_ns("dist", "tc", "qdisc", "add", "dev", b, "root", "tbf", "rate", rate,
                      "burst", "256kb", "latency", "100ms"))
    sh(*in_ns("dist", "ip", "link", "set", "lo", "up"))


def spawn(ns, *args, **kw):
    p = subprocess.Popen(in_ns(ns, BIN, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, **kw)
    PROCS.append(p)
    return p


def status():
    r = subprocess.run(in_ns("dist", BIN, "distributer", "status", "--addr", "127.0.0.1:7081"),
                       capture_output=True, text=True)
    return r.stdout


def wait_for(pred, what, limit=60):
    end = time.time() + limit
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}: {status()}")


def receivers(work, flow, names, runs, port=7080, joined=True):
    """Receivers of `flow` into WORK/FLOW-NAME, from the distributer's address on each one's link
    (at `port`); with `joined`, once the distributer's status lists them all."""
    ps = {}
    for name in names:
        i = {"fast1": 1, "fast2": 2, "far": 3}[name]
        out = os.path.join(work, f"{flow}-{name}")
        ps[name] = spawn(name, "receive", "--distributer", f"10.77.{i}.2:{port}", "--stream",
                         "obs", "--flow", flow, "--name", name, "--runs", str(runs), "--out", out)
    if joined:
        wait_for(lambda: all(f"  {n} " in status() for n in names), f"{names} to join {flow}")
    return ps


def same_file(path, want):
    """Whether `path` exists and its SHA-256 is `want`."""
    return os.path.exists(path) and hashlib.sha256(open(path, "rb").read()).hexdigest() == want


def all_kept(s, out, err, ps, work, name, want, by):
    """The sender `s` (which printed `out`, `err`) reports every receiver verified, and each
    receiver in `ps` ends well keeping the exact file as WORK/hold-RECEIVER/NAME."""
    check(s.returncode == 0 and out.count("digest verified") == len(ps),
          f"all {len(ps)} verified{by}: {out}{err}")
    for n, p in ps.items():
        p.communicate(timeout=60)
        same = same_file(os.path.join(work, f"hold-{n}", name), want)
        check(p.returncode == 0 and same, f"{n} holds the exact file{by}")


def send(path, flow, name):
    return spawn("snd", "-q", "send", path, "--distributer", "10.77.0.2:7080", "--stream", "obs",
                 "--flow", flow, "--param", f"name={name}")


def bench(runs):
    """Each receiver's rate behind its own 200 Mbit/s link, and iperf3's over one such link."""
    import json

    # Receivers keep each run in memory-backed files (tmpfs), so the time a receiver reports
    # (its start to its verified, synced stop) measures the link, not this machine's disk.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    work = tempfile.mkdtemp(prefix="bs-fanout-hosts-", dir=shm)
    try:
        setup()
        cfg = os.path.join(work, "streams.toml")
        with open(cfg, "w") as f:
            f.write('[[stream]]\nname = "obs"\n[[stream.flow]]\nname = "hold"\n')
        spawn("dist", "distributer", "--config", cfg, "--addr", "0.0.0.0:7080")
        wait_for(lambda: "obs/hold" in status(), "the distributer")
        path = os.path.join(work, "run.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(RUN_BYTES))
        names = ["fast1", "fast2", "far"]
        # One run more than measured, so they are still listed (with their last run's rate)
        # when each run ends.
        ps = receivers(work, "hold", names, runs + 1)
        rates = {n: [] for n in names}
        for p in ps.values():
            p.stdout.readline()  # "receiving …"
        for _ in range(runs):
            s = send(path, "hold", f"run-{len(rates[names[0]])}.bin")
            out, err = s.communicate(timeout=300)
            if s.returncode != 0:
                raise RuntimeError(f"send failed: {out}{err}")
            for n, p in ps.items():
                # "DIR/run.bin: N bytes, digest verified (S s, R Mbit/s)": the receiver's own
                # clock, from its start to its verified stop.
                line = p.stdout.readline()
                rates[n].append(float(line.rsplit(", ", 1)[1].split()[0]))
        for p in ps.values():
            p.kill()
        iperf = None
        if shutil.which("iperf3"):
            srv = subprocess.Popen(in_ns("fast1", "iperf3", "-s", "-1", "-B", "10.77.1.1"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            PROCS.append(srv)
            time.sleep(0.3)
            r = subprocess.run(in_ns("dist", "iperf3", "-c", "10.77.1.1", "-t", "3", "-J"),
                               capture_output=True, text=True)
            if r.returncode == 0:
                iperf = json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"] / 1e6
        print(json.dumps({"link_mbit": 200, "receiver_mbit": rates, "iperf3_mbit": iperf}))
    finally:
        cleanup()
        shutil.rmtree(work, ignore_errors=True)


def main():
    if BENCH:
        return bench(int(sys.argv[sys.argv.index("--bench") + 1]))
    work = tempfile.mkdtemp(prefix="bs-fanout-hosts-")
    try:
        setup()
        cfg = os.path.join(work, "streams.toml")
        with open(cfg, "w") as f:
            f.write('[[stream]]\nname = "obs"\n'
                    '[[stream.flow]]\nname = "hold"\npolicy = "hold"\n'
                    '[[stream.flow]]\nname = "timeout"\npolicy = "timeout"\ntimeout_ms = 1500\n'
                    # 18 MiB/s is 151 Mbit/s; a socket buffer above the link queue's, so the
                    # far link's queue overflows (loss) before the distributer's socket blocks.
                    '[[stream.flow]]\nname = "udp"\ntransport = "udp"\ndatagram = "8k"\n'
                    'chunk = "256k"\npace = "18m"\nsocket_buffer = "8m"\n')
        dist = spawn("dist", "distributer", "--config", cfg, "--addr", "0.0.0.0:7080")
        wait_for(lambda: "obs/hold" in status(), "the distributer")
        data = os.urandom(24 << 20)
        path = os.path.join(work, "scan.bin")
        with open(path, "wb") as f:
            f.write(data)
        want = hashlib.sha256(data).hexdigest()
        names = ["fast1", "fast2", "far"]

        # 1. Every receiver, each behind its own shaped link, keeps the exact file.
        ps = receivers(work, "hold", names, 1)
        t = time.time()
        s = send(path, "hold", "scan.bin")
        out, err = s.communicate(timeout=300)
        secs = time.time() - t
        all_kept(s, out, err, ps, work, "scan.bin", want, "")
        mbit = len(data) * 8 / secs / 1e6
        print(f"info: hold, receivers behind {RATE}, {RATE} and {FAR_RATE} links: {mbit:.0f} "
              f"Mbit/s each ({mbit / 100:.2f}× the slowest link, which sets the pace)", flush=True)

        # 2. A receiver frozen with SIGSTOP under timeout: dropped and reported; others finish.
        ps = receivers(work, "timeout", names, 1)
        os.kill(ps["far"].pid, signal.SIGSTOP)
        s = send(path, "timeout", "scan.bin")
        out, err = s.communicate(timeout=300)
        check(s.returncode != 0 and "far" in out and "FAILED" in out and "took nothing" in out,
              f"the frozen receiver is reported: {out}{err}")
        check(out.count("digest verified") == 2, "the two others verified")
        os.kill(ps["far"].pid, signal.SIGCONT)
        for n in ["fast1", "fast2"]:
            ps[n].communicate(timeout=60)
            check(ps[n].returncode == 0, f"{n} completed while far was frozen")
        ps["far"].communicate(timeout=60)
        check(ps["far"].returncode != 0, "far's run failed (it was dropped)")
        check(not os.path.exists(os.path.join(work, "timeout-far", "scan.bin")), "far kept nothing")

        # 3. A receiver killed mid-run under hold: reported; the others complete.
        ps = receivers(work, "hold", names, 1)
        s = send(path, "hold", "second.bin")
        wait_for(lambda: "running" in status(), "the run to start")
        ps["fast2"].kill()
        out, err = s.communicate(timeout=300)
        check("fast2" in out and "FAILED" in out, f"the killed receiver is reported: {out}{err}")
        check(out.count("digest verified") == 2, "the two others verified")

        # 4. A sender killed mid-run: every receiver's run fails, nothing is kept.
        ps = receivers(work, "hold", ["fast1", "far"], 1)
        slow = spawn("snd", "-q", "send", "-", "--distributer", "10.77.0.2:7080", "--stream",
                     "obs", "--flow", "hold", "--param", "name=lost.bin", stdin=subprocess.PIPE)
        slow.stdin.write("x" * (4 << 20))
        slow.stdin.flush()
        wait_for(lambda: "running" in status(), "the run to start")
        slow.kill()
        for n, p in ps.items():
            p.communicate(timeout=60)
            check(p.returncode != 0, f"{n}'s run failed when the sender died")
            check(not os.path.exists(os.path.join(work, f"hold-{n}", "lost.bin")) and
                  not os.path.exists(os.path.join(work, f"hold-{n}", ".lost.bin.blobstream-part")),
                  f"{n} kept nothing of it")
        # 5. A udp flow faster than the far link: far loses datagrams and is reported; the
        # others keep every byte.
        ps = receivers(work, "udp", names, 1)
        s = send(path, "udp", "scan.bin")
        out, err = s.communicate(timeout=300)
        far_line = next((l for l in out.splitlines() if l.strip().startswith("far")), "")
        check(s.returncode != 0 and "FAILED" in far_line and "lost" in far_line
              and "datagrams lost" in out, "far is reported with its loss", out + err)
        check(out.count("digest verified") == 2, "the two fast receivers verified", out)
        for n in ["fast1", "fast2"]:
            ps[n].communicate(timeout=60)
            same = same_file(os.path.join(work, f"udp-{n}", "scan.bin"), want)
            check(ps[n].returncode == 0 and same, f"{n} holds the exact file over udp")
        ps["far"].communicate(timeout=60)
        check(ps["far"].returncode != 0, "far's udp run failed")
        check(not os.path.exists(os.path.join(work, "udp-far", "scan.bin")) and
              not os.path.exists(os.path.join(work, "udp-far", ".scan.bin.blobstream-part")),
              "far kept nothing of its lossy run")
        print(f"info: udp at 151 Mbit/s to a 100 Mbit/s link: {far_line.strip()}", flush=True)
        dist.terminate()
        dist.communicate(timeout=60)

        # 6. The sender as its own distributer, on that host: it waits for every receiver,
        # and each keeps the exact file.
        s = spawn("dist", "send", path, "--serve", cfg, "--distributer", "0.0.0.0:7082",
                  "--stream", "obs", "--flow", "hold", "--receivers", "3",
                  "--param", "name=served.bin")
        said = s.stderr.readline()
        check("waiting for 3 receivers" in said, f"the sender serves the flow: {said.strip()}")
        # (It serves no status: it waits for them itself.)
        ps = receivers(work, "hold", names, 1, port=7082, joined=False)
        out, err = s.communicate(timeout=300)
        all_kept(s, out, err, ps, work, "served.bin", want, " from the serving sender")
    finally:
        cleanup()
        shutil.rmtree(work, ignore_errors=True)
    LAB.finish("fanout-hosts")


if __name__ == "__main__":
    main()
