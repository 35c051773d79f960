"""What the namespace scripts (scripts/*-hosts.py) share: running a command (in a network
namespace), the processes and namespaces to remove at the end, and the checks' verdict.

    lab = Lab("bsx123", ["client", "server"])   # names of the namespaces, created by add()
    lab.add()
    p = lab.track(subprocess.Popen(lab.in_ns("server", ...)))
    lab.check(cond, "what was checked")
    ...
    lab.cleanup()                                # every tracked process, every namespace
    lab.finish("x-hosts")                        # exit 1 naming how many checks failed
"""

import os
import signal
import signal
import subprocess
import sys


class Lab:
    def __init__(self, tag, names):
        self.ns = {n: f"{tag}-{n}" for n in names}
        self.procs = []
        self.failures = []
        # `timeout` (and a user's kill) stops a script with SIGTERM, whose default action
        # skips `finally`: exit as Python does, so the namespaces and processes are removed.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    def sh(self, *cmd, check=True):
        r = subprocess.run(cmd, capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
        return r

    def in_ns(self, ns, *cmd):
        return ["ip", "netns", "exec", self.ns[ns], *cmd]

    def add(self):
        for n in self.ns.values():
            self.sh("ip", "netns", "add", n)

    def track(self, p):
        self.procs.append(p)
        return p

    def check(self, cond, what, detail=""):
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)
            if detail:
                print("     " + detail.strip().replace("\n", "\n     "), flush=True)

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)  # a process a check froze
                    p.kill()
                    p.wait(timeout=10)
                except Exception:
                    pass
        for n in self.ns.values():
            self.sh("ip", "netns", "del", n, check=False)

    def finish(self, name):
        if self.failures:
            print(f"{name}: {len(self.failures)} check(s) failed", flush=True)
            sys.exit(1)
        print(f"{name}: all checks passed", flush=True)
