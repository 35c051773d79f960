#!/usr/bin/env python3
"""Chaos driver for blobstream (run by scripts/chaos; stdlib only).

Four scenarios against the real binary, each on its own server, data directory and loopback
ports. Every random choice comes from CHAOS_SEED, and no check depends on timing: timings and
ratios are reported, never judged. Prints one table row per scenario and exits 1 if any check
failed.

  crash     SIGKILL the server several times during ~1,000 concurrent uploads, restart it on
            the same data directory. Promise: a blob is visible only when every byte is durable,
            so every acknowledged put survives with its exact bytes, nothing partial is ever
            listed, and a retried put of the same content succeeds ("already there").
  bitrot    Flip one byte in stored blob files. Promise: no read path (get, resumed get, cat,
            HTTP GET, HTTP Range) returns a wrong byte with success; scrub names exactly the
            rotten blobs; untouched blobs still read back.
  idle      1,000 idle connections at the data port plus a thread that keeps reconnecting.
            Promise: a client holding a valid token always gets through.
  fulldisk  Fill a 64 MiB tmpfs data directory. Promise: a full disk fails only its own write,
            with a clear error; rm is atomic with respect to the catalogue; no blob is listed
            that cannot be read.
"""

import concurrent.futures as cf
import hashlib
import http.client
import json
import os
import random
import re
import resource
import selectors
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

BIN = os.environ["BLOBSTREAM_BIN"]
SEED = int(os.environ.get("CHAOS_SEED", "20261123"))
DEADLINE = time.monotonic() + int(os.environ.get("CHAOS_TIME_LIMIT", "360")) - 25
ONLY = [s for s in os.environ.get("CHAOS_ONLY", "").split(",") if s]
MiB = 1 << 20
INLINE_UP_TO = 64 << 10  # blobs this small live in their catalogue row (bs_store::fs::INLINE_UP_TO)
WORK = tempfile.mkdtemp(prefix="blobstream-chaos-")
PROCS = set()  # every process started, so cleanup can stop them by pid
MOUNTS = []  # every tmpfs mounted
PROCS_LOCK = threading.Lock()
SERVERS = []  # every Server, stopped when its scenario ends however it ends
# Client environment: no token or TLS settings leak in from the caller.
ENV = {k: v for k, v in os.environ.items() if not k.startswith("BLOBSTREAM_")}


class Deadline(Exception):
    pass


def remaining():
    left = DEADLINE - time.monotonic()
    if left <= 0:
        raise Deadline("time budget exhausted (CHAOS_TIME_LIMIT)")
    return left


def log(msg):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def payload(tag, size):
    """Deterministic bytes for `tag` (a string), different for every tag."""
    return random.Random(f"{SEED}/{tag}").randbytes(size)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def sha_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)
    return path


def spawn(cmd, **kw):
    p = subprocess.Popen(cmd, env=ENV, stdin=subprocess.DEVNULL, **kw)
    with PROCS_LOCK:
        PROCS.add(p)
    return p


def run(cmd, timeout=120):
    """Runs a command to completion; rc None means it was killed at its timeout."""
    p = spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = p.communicate(timeout=min(timeout, remaining()))
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        rc = None
    finally:
        with PROCS_LOCK:
            PROCS.discard(p)
    return rc, out, err.decode(errors="replace").strip()


class Server:
    """One `blobstream serve` on loopback ports of its own, restartable on the same data dir."""

    def __init__(self, name, data, http=False):
        self.data, self.proc, self.data_addr = data, None, None
        self.addr = f"127.0.0.1:{free_port()}"
        self.http = f"127.0.0.1:{free_port()}" if http else None
        self.log = os.path.join(WORK, f"{name}.log")
        self.starts = 0
        SERVERS.append(self)

    def bs(self, *args, timeout=120):
        return run([BIN, "--server", self.addr, *args], timeout)  # stderr is no tty: no progress bars

    def start(self, timeout=60):
        cmd = [BIN, "serve", "--data", self.data, "--addr", self.addr]
        cmd += ["--http", self.http] if self.http else ["--no-http"]
        cmd += [f for f in ("--no-samples",) if f in SERVE_HELP]
        cmd += ["--scrub-every", "0"] if "--scrub-every" in SERVE_HELP else []
        end = time.monotonic() + timeout
        while True:
            offset = os.path.getsize(self.log) if os.path.exists(self.log) else 0
            with open(self.log, "ab") as out:
                self.proc = spawn(cmd, stdout=out, stderr=subprocess.STDOUT)
            # Ready when a control call answers; a start that died (the port still held after
            # a kill, say) is tried again until the timeout.
            while self.proc.poll() is None and time.monotonic() < end:
                if self.bs("ls", timeout=10)[0] == 0:
                    self.starts += 1
                    with open(self.log, "rb") as f:
                        f.seek(offset)
                        text = re.sub(r"\x1b\[[0-9;]*m", "", f.read().decode(errors="replace"))
                    m = re.search(r"data plane \(TCP\):\s*(\S+)", text) or re.search(
                        r"data_addr=(\S+)", text)
                    self.data_addr = m.group(1) if m else None
                    return
                time.sleep(0.1)
            self.stop(signal.SIGKILL)
            if time.monotonic() >= end:
                raise RuntimeError(f"server did not start in {timeout} s (see {self.log}): "
                                   + open(self.log, errors="replace").read()[-600:])
            time.sleep(0.3)

    def stop(self, sig=signal.SIGTERM, timeout=40):
        """Signals the server and waits for it; returns its exit status."""
        p, self.proc = self.proc, None
        if p is None:
            return None
        if p.poll() is None:
            p.send_signal(sig)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        with PROCS_LOCK:
            PROCS.discard(p)
        return p.returncode

    def restart(self, sig=signal.SIGKILL):
        self.stop(sig)
        self.start()

    def ls(self, prefix=""):
        rc, out, err = self.bs("ls", prefix, "--json")
        if rc != 0:
            raise RuntimeError(f"ls failed: {err}")
        return {b["name"]: b for b in json.loads(out)}

    def shared_commits(self):
        """Catalogue writes that shared a commit with another since this server started, from
        its /metrics (None when it does not answer)."""
        try:
            c = http.client.HTTPConnection(self.http, timeout=5)
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
        except OSError:
            return None
        n = {m.group(1): int(float(m.group(2))) for m in re.finditer(
            r"^blobstream_http_catalogue_group_commit(s|_writes)_total (\S+)$", text, re.M)}
        return n["_writes"] - n["s"] if len(n) == 2 else None

    def get_sha(self, key, out):
        """`get KEY out` into a fresh path; (rc, sha256 of out or None, stderr)."""
        rc, _, err = self.bs("get", key, out)
        digest = sha_file(out) if rc == 0 and os.path.exists(out) else None
        for p in (out, out + ".blobstream-part"):
            if os.path.exists(p):
                os.unlink(p)
        return rc, digest, err


class Scenario:
    def __init__(self, name, what):
        self.name, self.what = name, what
        self.counts, self.failures, self.info = {}, [], []

    def check(self, ok, msg):
        if not ok:
            self.failures.append(msg)
        return ok

    def count(self, key, n=1):
        with PROCS_LOCK:
            self.counts[key] = self.counts.get(key, 0) + n


def parallel(fn, items, workers=6):
    with cf.ThreadPoolExecutor(workers) as ex:
        return list(ex.map(fn, items))


# ---------------------------------------------------------------------------------------------
# 1. crash: SIGKILL during 1,000 concurrent uploads, restart on the same data directory.

def scenario_crash(sc):
    n, workers = int(os.environ.get("CHAOS_UPLOADS", "1000")), 6
    kills = int(os.environ.get("CHAOS_KILLS", "6"))
    rng = random.Random(f"{SEED}/crash")
    tasks = []  # (key, size, overwrite); 10% of puts overwrite one of 20 shared keys
    for i in range(n):
        r = rng.random()
        size = (0 if r < 0.01 else rng.randrange(1, 64 << 10) if r < 0.7
                else rng.randrange(64 << 10, 512 << 10) if r < 0.98 else rng.randrange(MiB, 4 * MiB))
        shared = rng.random() < 0.1
        tasks.append((f"crash/ow{rng.randrange(20):02d}" if shared else f"crash/u{i:04d}", size, shared))
    kill_at = sorted(rng.sample(range(n // 10, n * 9 // 10), kills))
    kill_delay = [rng.uniform(0, 0.4) for _ in kill_at]
    pdir = os.path.join(WORK, "crash-payloads")
    os.makedirs(pdir)
    shas = {}  # key -> {sha256 of every payload put to it}
    sizes = {}  # key -> {sizes}
    for i, (key, size, _) in enumerate(tasks):
        shas.setdefault(key, set()).add(sha(payload(f"crash/{i}", size)))
        sizes.setdefault(key, set()).add(size)
    srv = Server("crash", os.path.join(WORK, "crash-data"), http=True)
    srv.start()
    up, abort = threading.Event(), threading.Event()
    up.set()
    lock = threading.Lock()
    started = [0]
    kill_due = threading.Event()
    acked = {}  # task index -> attempts it took
    errors, reasons = {}, {}  # task -> last error; last clause of an error -> how often

    def upload(i):
        key, size, shared = tasks[i]
        path = write(os.path.join(pdir, str(i)), payload(f"crash/{i}", size))
        with lock:
            started[0] += 1
            if len(kill_at) > sc.counts.get("SIGKILLs", 0) and started[0] >= kill_at[sc.counts.get("SIGKILLs", 0)]:
                kill_due.set()
        for attempt in range(12):
            if abort.is_set():
                return
            if not up.wait(min(120, remaining())):
                raise Deadline("server not back up")
            rc, _, err = srv.bs("put", path, key, *(["--overwrite"] if shared else []), timeout=90)
            if rc == 0:
                acked[i] = attempt
                if attempt:
                    sc.count("retries ok")
                    if "already" in err:
                        sc.count("committed-but-failed, retry 'already there'")
                return
            if rc is None:
                sc.count("client timeouts (90 s)")
            errors[i] = err
            reason = re.sub(r".*?: (?=[^:]*$)", "", err.splitlines()[-1] if err else f"exit {rc}")
            with lock:
                reasons[reason[:90]] = reasons.get(reason[:90], 0) + 1
            # A server killed mid-put cuts the connection; it never reports an internal error.
            sc.check("Internal" not in err, f"put {key} (attempt {attempt + 1}): {err}")
            # A retry of identical content must never be refused as existing (issue 8, item 7).
            if not shared and "exist" in err.lower():
                sc.check(False, f"put {key} (attempt {attempt + 1}) refused: {err}")
                return
            time.sleep(0.05 * (attempt + 1))
        sc.check(False, f"put {key} never succeeded in 12 attempts: {errors.get(i)}")

    def spot_check(label):
        """After a restart: every listed blob has the size of a payload put to it, and a
        seeded sample reads back as one of them (nothing partial is visible)."""
        listed = srv.ls("crash/")
        for name, b in listed.items():
            sc.check(b["size"] in sizes.get(name, ()), f"{label}: {name} listed with size {b['size']}, never put")
        sample = sorted(listed)
        for j, name in enumerate(random.Random(f"{SEED}/{label}").sample(sample, min(8, len(sample)))):
            rc, d, err = srv.get_sha(name, os.path.join(WORK, f"spot-{j}"))
            sc.check(rc == 0 and d in shas.get(name, ()), f"{label}: get {name}: rc={rc} {err}")
            sc.count("post-restart reads")

    def live_listing():
        """While uploads run: every listed blob has the size of a payload put to it."""
        rc, out, _ = srv.bs("ls", "crash/", "--json", timeout=30)
        if rc == 0:  # (the server may just have been killed)
            for b in json.loads(out):
                sc.check(b["size"] in sizes.get(b["name"], ()), f"live ls: {b['name']} has size {b['size']}, never put")
            sc.count("live listings checked")

    pool = cf.ThreadPoolExecutor(workers)
    futures = [pool.submit(upload, i) for i in range(n)]
    last_ls = time.monotonic()
    try:
        # The controller: at each seeded point, SIGKILL the server mid-upload, restart it.
        while not all(f.done() for f in futures):
            if up.is_set() and time.monotonic() - last_ls > 1:
                live_listing()
                last_ls = time.monotonic()
            if kill_due.wait(0.2):
                k = sc.counts.get("SIGKILLs", 0)
                time.sleep(kill_delay[k])
                shared_commits = srv.shared_commits()
                if shared_commits is not None:
                    sc.count("catalogue writes that shared a commit", shared_commits)
                up.clear()
                srv.stop(signal.SIGKILL)
                sc.count("SIGKILLs")
                with lock:
                    kill_due.clear()
                    if k + 1 < len(kill_at) and started[0] >= kill_at[k + 1]:
                        kill_due.set()
                srv.start()
                spot_check(f"restart {k + 1}")
                up.set()
            remaining()
        for f in futures:
            f.result()
    except BaseException:
        abort.set()
        raise
    finally:
        up.set()
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)
    sc.counts["uploads"] = n
    sc.counts["acknowledged"] = len(acked)
    sc.check(sc.counts.get("SIGKILLs", 0) == kills, f"only {sc.counts.get('SIGKILLs', 0)} of {kills} kills happened")
    # The kills fell on group commits: six concurrent writers always overlap some commits.
    sc.check(sc.counts.get("catalogue writes that shared a commit", 0) > 0,
             "no catalogue commit was shared: the crash test never exercised group commit")

    # One more kill and restart while idle: start-up must clean up, then check everything.
    srv.restart(signal.SIGKILL)
    listed = srv.ls("crash/")
    acked_keys = {tasks[i][0] for i in acked}
    for key in sorted(acked_keys):
        sc.check(key in listed, f"acknowledged {key} is not listed")
    for name in listed:
        sc.check(name in shas, f"listed {name} was never put")

    def verify(name):
        rc, d, err = srv.get_sha(name, os.path.join(WORK, "verify-" + name.replace("/", "_")))
        return name, rc, d, err

    for name, rc, d, err in parallel(verify, sorted(listed)):
        sc.count("listed blobs read back")
        if not sc.check(rc == 0, f"get {name}: exit {rc}: {err}"):
            continue
        unique = not name.startswith("crash/ow")
        sc.check(d in shas[name], f"get {name}: bytes differ from {'the' if unique else 'every'} payload put")
    # Idempotent put: re-put identical content to 50 acknowledged unique keys.
    again = sorted(i for i in acked if not tasks[i][2])
    again = random.Random(f"{SEED}/again").sample(again, min(50, len(again)))

    def reput(i):
        return i, srv.bs("put", os.path.join(pdir, str(i)), tasks[i][0])

    for i, (rc, _, err) in parallel(reput, again):
        sc.count("identical re-puts")
        sc.check(rc == 0 and "already" in err, f"re-put of identical {tasks[i][0]}: exit {rc}: {err}")
    # Unreferenced files are removed at start: one file per listed blob too large for its
    # catalogue row remains.
    files = sum(len(fs) for _, _, fs in os.walk(os.path.join(srv.data, "blobs")))
    filed = sum(1 for b in listed.values() if b["size"] > INLINE_UP_TO)
    sc.check(files == filed, f"{files} files under blobs/ for {filed} blobs kept in files after a restart")
    staging = os.path.join(srv.data, "staging")
    sc.info.append(f"staging files left: {len(os.listdir(staging)) if os.path.isdir(staging) else 0}")
    sc.info.append(f"server exit status on SIGTERM: {srv.stop()}")
    for reason, k in sorted(reasons.items(), key=lambda x: -x[1]):
        sc.info.append(f"failed put attempts: {k} x {reason!r}")
    shutil.rmtree(pdir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# 2. bitrot: flip one byte in stored files; no read path may return a wrong byte with success.

def http_get(srv, key, rng=None):
    """(status, content_length, body, complete) — complete False when the body was cut."""
    host, port = srv.http.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        path = "/blobs/" + "/".join(urllib.parse.quote(s, safe="") for s in key.split("/"))
        c.request("GET", path, headers={"Range": f"bytes={rng[0]}-{rng[1]}"} if rng else {})
        r = c.getresponse()
        cl = r.getheader("Content-Length")
        parts, complete = [], True
        try:
            while chunk := r.read(MiB):
                parts.append(chunk)
        except (http.client.IncompleteRead, ConnectionError, socket.timeout) as e:
            complete = False
            parts.append(getattr(e, "partial", b""))
        body = b"".join(parts)
        if cl is not None and len(body) != int(cl):
            complete = False
        return r.status, cl, body, complete
    finally:
        c.close()


def judge_http(sc, label, res, want):
    """A 2xx body may be short (cut at a bad chunk) but every byte that came must be right."""
    status, cl, body, complete = res
    if not 200 <= status < 300:
        sc.count("HTTP refused (non-2xx)")
        return
    sc.check(want.startswith(body), f"{label}: {status} body has a wrong byte (got {len(body)} of {cl} bytes)")
    sc.check(not complete or body == want, f"{label}: {status} complete body of {len(body)} bytes is wrong")
    sc.count("HTTP cut short" if not complete else "HTTP served correct bytes")


def scenario_bitrot(sc):
    rng = random.Random(f"{SEED}/bitrot")
    srv = Server("bitrot", os.path.join(WORK, "bitrot-data"), http=True)
    srv.start()
    firsts = ["get", "http", "range", "cat"]  # the read path that meets each rotten blob first
    blobs = {}  # key -> (bytes, flip offset or None)
    for size in (43_000, 3 * MiB, 64 * MiB):
        for first in firsts + ["clean"]:
            key = f"rot/{size}/{first}"
            data = payload(key, size)
            rc, _, err = srv.bs("put", write(os.path.join(WORK, "rot-in"), data), key)
            if not sc.check(rc == 0, f"put {key}: {err}"):
                continue
            blobs[key] = (data, None if first == "clean" else rng.randrange(size))
    os.unlink(os.path.join(WORK, "rot-in"))
    # Find each blob's file (blobs/<2 hex>/<id>) by size and content, and flip one byte.
    by_sha = {sha(d): k for k, (d, _) in blobs.items()}
    size_of = {len(d) for d, _ in blobs.values()}
    flip = lambda key, b: b ^ random.Random(f"{SEED}/flip/{key}").randrange(1, 256)
    for dirpath, _, files in os.walk(os.path.join(srv.data, "blobs")):
        for f in files:
            path = os.path.join(dirpath, f)
            key = by_sha.get(sha_file(path)) if os.path.getsize(path) in size_of else None
            if key and blobs[key][1] is not None:
                with open(path, "r+b") as fh:
                    fh.seek(blobs[key][1])
                    b = fh.read(1)[0]
                    fh.seek(blobs[key][1])
                    fh.write(bytes([flip(key, b)]))
                sc.count("bytes flipped")
    # A small blob lives in its catalogue row: flip the byte there, behind the server's back.
    db = sqlite3.connect(os.path.join(srv.data, "meta.db"), timeout=30)
    with db:
        for name, data in db.execute("SELECT name, inline_data FROM blobs WHERE inline_data IS NOT NULL").fetchall():
            key = by_sha.get(sha(data))
            if key and blobs[key][1] is not None:
                off = blobs[key][1]
                data = data[:off] + bytes([flip(key, data[off])]) + data[off + 1:]
                db.execute("UPDATE blobs SET inline_data = ? WHERE name = ?", (data, name))
                sc.count("bytes flipped")
    db.close()
    rotten = sorted(k for k, (_, off) in blobs.items() if off is not None)
    sc.check(sc.counts.get("bytes flipped", 0) == len(rotten), "not every rotten blob's file was found")

    out = os.path.join(WORK, "rot-out")

    def read_get(key, data, off):
        for attempt in ("get", "get again (resume)"):
            rc, _, err = srv.bs("get", key, out)
            sc.check(rc != 0, f"{attempt} {key}: exit 0 on a rotten blob")
            sc.check(not os.path.exists(out), f"{attempt} {key}: output file exists after failure")
            if os.path.exists(out + ".blobstream-part"):
                part = open(out + ".blobstream-part", "rb").read()
                sc.check(data.startswith(part), f"{attempt} {key}: part file holds a wrong byte")
        for p in (out, out + ".blobstream-part"):
            if os.path.exists(p):
                os.unlink(p)
        sc.count("gets refused")

    def read_cat(key, data, off):  # pipes: `cat KEY` and `get KEY -`
        for cmd in (["cat", key], ["get", key, "-"]):
            rc, body, err = srv.bs(*cmd)
            what = " ".join(cmd)
            sc.check(rc != 0, f"{what}: exit 0 on a rotten blob")
            sc.check(data.startswith(body), f"{what}: wrote a wrong byte ({len(body)} bytes out)")
            if body:
                sc.info.append(f"{what}: exit {rc} after {len(body)} correct bytes (bad byte at {off})")
            sc.count("pipe reads refused")

    def read_http(key, data, off):
        judge_http(sc, f"GET /blobs/{key}", http_get(srv, key), data)

    def read_range(key, data, off):
        a, b = max(0, off - 1000), min(len(data) - 1, off + 1000)
        judge_http(sc, f"GET /blobs/{key} Range {a}-{b}", http_get(srv, key, (a, b)), data[a:b + 1])

    paths = {"get": read_get, "cat": read_cat, "http": read_http, "range": read_range}
    for key in rotten:
        data, off = blobs[key]
        first = key.rsplit("/", 1)[1]
        order = firsts[firsts.index(first):] + firsts[:firsts.index(first)]
        for p in order:
            paths[p](key, data, off)
    # scrub names exactly the rotten blobs.
    rc, out_json, err = srv.bs("scrub", "--json")
    sc.check(rc == 1, f"scrub exited {rc}, want 1: {err}")
    try:
        report = json.loads(out_json)
        named = sorted(c["name"] for c in report["corrupt"])
        sc.check(named == rotten, f"scrub named {named}, want {rotten}")
        sc.check(not report["failed"], f"scrub could not read {report['failed']}")
        sc.counts["scrub named"] = len(named)
    except (ValueError, KeyError) as e:
        sc.check(False, f"scrub --json output unreadable ({e}): {out_json[:200]!r}")
    # Untouched blobs read back exactly on every path, after the scrub too.
    for key in sorted(k for k, (_, off) in blobs.items() if off is None):
        data = blobs[key][0]
        rc, d, err = srv.get_sha(key, out)
        sc.check(rc == 0 and d == sha(data), f"get clean {key}: exit {rc} {err}")
        rc, body, err = srv.bs("cat", key)
        sc.check(rc == 0 and body == data, f"cat clean {key}: exit {rc} {err}")
        st, _, body, complete = http_get(srv, key)
        sc.check(st == 200 and complete and body == data, f"GET clean {key}: {st}, {len(body)} bytes")
        a = len(data) // 3
        st, _, body, complete = http_get(srv, key, (a, a + 5000))
        sc.check(st == 206 and body == data[a:a + 5001], f"Range on clean {key}: {st}, {len(body)} bytes")
        sc.count("clean blobs verified")
        # A resume must verify what it keeps: a full-length part file with one wrong byte
        # left where `get` resumes from must not end up in the output.
        bad = bytearray(data)
        bad[len(data) // 2] ^= 0x55
        write(out + ".blobstream-part", bad)
        rc, d, err = srv.get_sha(key, out)
        sc.check(rc != 0 or d == sha(data), f"get {key} over a bad part file: exit 0 with wrong bytes")
        sc.count("bad part file: " + ("re-fetched" if rc == 0 else "refused"))
    # After a restart, rotten blobs are still refused.
    srv.restart(signal.SIGKILL)
    for key in rotten:
        rc, _, err = srv.bs("get", key, out)
        sc.check(rc != 0 and not os.path.exists(out), f"get {key} after restart: exit {rc}")
        for p in (out, out + ".blobstream-part"):
            if os.path.exists(p):
                os.unlink(p)
        sc.count("gets refused after restart")
    sc.counts["rotten blobs"] = len(rotten)
    srv.stop()


# ---------------------------------------------------------------------------------------------
# 3. idle: strangers hold the data port; legitimate 64 MiB puts and gets must all go through.

HALF_HELLO = b"BS\x01\x01" + (32).to_bytes(4, "big") + bytes(4)  # 12 of HELLO's 24 header bytes


class Attack:
    """IDLE idle connections from 16 loopback addresses, reopened whenever the server drops
    one, and a thread that keeps reconnecting from 127.0.0.1 (the legitimate client's address)
    with half a HELLO header, holding its latest 100."""

    IDLE, CHURN_HELD = 1000, 100

    def __init__(self, addr):
        self.addr, self.stop_ev = addr, threading.Event()
        self.opened = self.dropped = self.churned = 0
        self.sel = selectors.DefaultSelector()
        for i in range(self.IDLE):
            self._open(f"127.0.0.{1 + i % 16}")
        self.initial = self.opened
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._hold, self._churn)]
        for t in self.threads:
            t.start()

    def _open(self, src):
        s = socket.socket()
        s.settimeout(5)
        try:
            s.bind((src, 0))
            s.connect(self.addr)
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, src)
            self.opened += 1
        except OSError:
            s.close()

    def _hold(self):
        while not self.stop_ev.is_set():
            for k, _ in self.sel.select(0.2):
                try:  # any answer (an ERROR frame, EOF, a reset) means refused or evicted
                    k.fileobj.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                self.sel.unregister(k.fileobj)
                k.fileobj.close()
                self.dropped += 1
                self._open(k.data)

    def _churn(self):
        held = []
        while not self.stop_ev.is_set():
            try:
                s = socket.create_connection(self.addr, timeout=5)
                s.sendall(HALF_HELLO)
            except OSError:
                continue
            held.append(s)
            if len(held) > self.CHURN_HELD:
                held.pop(0).close()
            self.churned += 1
        for s in held:
            s.close()

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(30)
        held = len(self.sel.get_map())
        for k in list(self.sel.get_map().values()):
            k.fileobj.close()
        self.sel.close()
        return held


def scenario_idle(sc):
    srv = Server("idle", os.path.join(WORK, "idle-data"))
    srv.start()
    if not sc.check(srv.data_addr, "could not find the data port in the server's output"):
        return
    host, port = srv.data_addr.rsplit(":", 1)
    src = write(os.path.join(WORK, "idle-in"), payload("idle", 64 * MiB))
    want, out = sha_file(src), os.path.join(WORK, "idle-out")
    times = {}

    def rounds(label, n=3):
        for r in range(n):
            key = f"idle/{label}/{r}"
            t0 = time.monotonic()
            rc, _, err = srv.bs("put", src, key)
            t1 = time.monotonic()
            sc.check(rc == 0, f"{label} put {key}: exit {rc}: {err}")
            rc2, d, err2 = srv.get_sha(key, out)
            t2 = time.monotonic()
            sc.check(rc2 == 0 and d == want, f"{label} get {key}: exit {rc2} {err2}")
            sc.count(f"{label} 64 MiB put+get ok", rc == 0 and rc2 == 0 and d == want)
            times.setdefault(label, {"put": [], "get": []})
            times[label]["put"].append(t1 - t0)
            times[label]["get"].append(t2 - t1)

    rounds("unattacked")
    attack = Attack((host, int(port)))
    sc.counts["idle conns opened"] = attack.initial
    try:
        rounds("attacked")
    finally:
        held = attack.stop()
    sc.counts["reopened after drop"] = attack.dropped
    sc.counts["churn conns"] = attack.churned
    sc.info.append(f"idle connections still held at the end: {held}")
    sc.check(attack.initial == Attack.IDLE, f"only {attack.initial} idle connections opened")
    for op in ("put", "get"):  # informational only: timings never fail the run
        un, at = statistics.median(times["unattacked"][op]), statistics.median(times["attacked"][op])
        sc.info.append(f"64 MiB {op}: attacked speed {un / at:.2f}x unattacked "
                       f"(median {at:.2f} s vs {un:.2f} s)")
    srv.stop()
    os.unlink(src)


# ---------------------------------------------------------------------------------------------
# 4. fulldisk: a 64 MiB tmpfs as the data directory, filled to the last block.

def scenario_fulldisk(sc):
    mnt = os.path.join(WORK, "tmpfs")
    os.makedirs(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt],
                       capture_output=True, text=True, timeout=30)
    if not sc.check(r.returncode == 0, f"cannot mount a tmpfs (needs root): {r.stderr.strip()}"):
        return
    MOUNTS.append(mnt)
    srv = Server("fulldisk", os.path.join(mnt, "data"))
    srv.start()
    acked, full_errors, i = {}, [], 0  # acked: key -> sha256
    for size in (4 * MiB, MiB, 256 << 10, 64 << 10, 16 << 10, 4 << 10):
        for _ in range(40):
            key = f"full/{i:03d}-{size}"
            data = payload(key, size)
            rc, _, err = srv.bs("put", write(os.path.join(WORK, "full-in"), data), key)
            i += 1
            if rc != 0:
                full_errors.append(err)
                sc.check(re.search(r"full|space", err, re.I), f"put {key} failed without saying the disk is full: {err}")
                break
            acked[key] = sha(data)
    st = os.statvfs(mnt)
    sc.counts["puts acknowledged"] = len(acked)
    sc.counts["puts refused (full)"] = len(full_errors)
    sc.info.append(f"tmpfs free after filling: {st.f_bavail * st.f_frsize} bytes")
    for e in sorted({re.sub(r".*?: (?=server|storage|metadata)", "", e, 1) for e in full_errors}):
        sc.info.append(f"full-disk put error: {e}")
    sc.check(full_errors, "the disk never filled up")
    victim = min(acked)
    rc, _, err = srv.bs("rm", victim)
    listed = srv.ls("full/")
    if rc == 0:
        sc.info.append("rm on the full disk: succeeded")
        sc.check(victim not in listed, f"rm {victim} exited 0 but it is still listed")
        sc.check(srv.bs("stat", victim)[0] != 0, f"rm {victim} exited 0 but stat still finds it")
        del acked[victim]
    else:
        sc.info.append(f"rm on the full disk: refused ({err})")
        sc.check(victim in listed, f"rm {victim} failed but the blob is no longer listed")
        rc, d, err = srv.get_sha(victim, os.path.join(WORK, "full-out"))
        sc.check(rc == 0 and d == acked[victim], f"rm {victim} failed and get then fails: {err}")
    rc, _, err = srv.bs("put", write(os.path.join(WORK, "full-in"), payload("after-rm", MiB)), "full/after-rm")
    sc.info.append(f"1 MiB put after the rm: {'ok' if rc == 0 else 'refused: ' + err}")
    if rc == 0:
        acked["full/after-rm"] = sha(payload("after-rm", MiB))
    # After a restart on the still-full disk: every acknowledged blob reads back exactly, the
    # removed one stays gone, and nothing is listed that cannot be read.
    srv.restart(signal.SIGKILL)
    listed = srv.ls("full/")
    for key, want in sorted(acked.items()):
        sc.check(key in listed, f"acknowledged {key} not listed after restart")
    sc.check(victim in acked or victim not in listed, f"removed {victim} is listed again after restart")
    sc.check(victim in acked or srv.bs("stat", victim)[0] != 0, f"removed {victim} found by stat after restart")
    if victim in acked:  # rm was refused: once more after the restart, still on a full disk
        rc, _, err = srv.bs("rm", victim)
        sc.info.append(f"rm after restart, disk still full: {'succeeded' if rc == 0 else 'refused: ' + err}")
        if rc == 0:
            del acked[victim]
            sc.check(victim not in srv.ls("full/"), f"rm {victim} exited 0 but it is still listed")
            sc.check(srv.bs("stat", victim)[0] != 0, f"rm {victim} exited 0 but stat still finds it")
        listed = srv.ls("full/")
    for key in sorted(listed):
        rc, d, err = srv.get_sha(key, os.path.join(WORK, "full-out"))
        sc.check(rc == 0, f"listed {key} cannot be read: {err}")
        sc.check(rc != 0 or d == acked.get(key), f"get {key}: bytes differ from what was put")
        sc.count("blobs read back")
    srv.stop()
    os.unlink(os.path.join(WORK, "full-in"))


# ---------------------------------------------------------------------------------------------

SCENARIOS = [
    ("crash", "SIGKILL during 1,000 concurrent puts, restart same dir", scenario_crash),
    ("bitrot", "flip 1 byte in 43 KB (in its catalogue row), 3 MiB and 64 MiB blobs", scenario_bitrot),
    ("idle", "1,000 idle + churning conns at data port", scenario_idle),
    ("fulldisk", "fill 64 MiB tmpfs, rm, restart", scenario_fulldisk),
]


def cleanup():
    with PROCS_LOCK:
        procs = list(PROCS)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    for m in MOUNTS:
        subprocess.run(["umount", m], capture_output=True, timeout=30)
        if os.path.ismount(m):
            subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)
    shutil.rmtree(WORK, ignore_errors=True)


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    global SERVE_HELP
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # servers inherit it too
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    SERVE_HELP = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True).stdout
    log(f"binary {BIN}, seed {SEED}, work dir {WORK}")
    results, interrupted = [], False
    try:
        for name, what, fn in SCENARIOS:
            if ONLY and name not in ONLY:
                continue
            sc = Scenario(name, what)
            t0 = time.monotonic()
            log(f"scenario {name}: {what}")
            results.append(sc)
            try:
                fn(sc)
            except Deadline as e:
                sc.check(False, f"aborted: {e}")
            except KeyboardInterrupt as e:  # SIGTERM (the wrapper's hard cap) or Ctrl-C
                sc.check(False, f"interrupted: {e}")
                interrupted = True
            except Exception as e:  # noqa: BLE001 — an unexpected error fails the scenario
                sc.check(False, f"aborted: {type(e).__name__}: {e}")
            finally:
                while SERVERS:
                    SERVERS.pop().stop(signal.SIGKILL)
            sc.secs = time.monotonic() - t0
            log(f"scenario {name}: {'PASS' if not sc.failures else 'FAIL'} in {sc.secs:.0f} s")
            for line in sc.info:
                log(f"  {line}")
            for f in sc.failures[:15]:
                log(f"  FAIL: {f}")
            if len(sc.failures) > 15:
                log(f"  ... and {len(sc.failures) - 15} more failures")
            if interrupted:
                break
    finally:
        cleanup()
    print(f"\n{'scenario':<9} | {'verdict':<9} | {'time':>5} | {'what was done':<55} | counts")
    print(f"{'-' * 9}-+-{'-' * 9}-+-{'-' * 5}-+-{'-' * 55}-+-{'-' * 40}")
    for sc in results:
        counts = ", ".join(f"{k}: {int(v)}" for k, v in sc.counts.items())
        verdict = "PASS" if not sc.failures else f"FAIL ({len(sc.failures)})"
        print(f"{sc.name:<9} | {verdict:<9} | {sc.secs:>4.0f}s | {sc.what:<55} | {counts}")
    failed = [sc.name for sc in results if sc.failures]
    print(f"\nchaos: {'FAILED: ' + ', '.join(failed) if failed else 'all scenarios passed'} (seed {SEED})")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
