"""A 2-node Ray cluster on this one host, for `pipe predict --ray`'s tests and benchmark (facts §18).

    with LoopbackCluster(env={"PYTHONPATH": repo}) as c:
        subprocess.run(["pipe", "predict", PACKAGE, PAGES, "--out", OUT, "--ray", c.address])

The head on 127.0.0.2 and a worker node on 127.0.0.3 (127.0.0.1 is silently rewritten to eth0's address), one CPU
each by default, each with its own temp dir (a shared one mislabels logs; short, for Ray's socket paths), memory and
object store (otherwise each claims the whole host's RAM), usage stats and auth off. Stopped by killing its own
processes: those whose command line names its temp dirs or its GCS address, and all their descendants, listed
before any kill (a killed raylet's workers are re-parented to init). Never `ray stop`: it kills every Ray process
on the host, of every user.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def procs() -> dict[int, tuple[int, bytes]]:
    """pid -> (ppid, cmdline) of every running process (not zombies: a container's init may reap none)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
            if state != "Z":
                found[int(stat.parent.name)] = (int(ppid), (stat.parent / "cmdline").read_bytes())
        except (OSError, IndexError, ValueError):
            continue
    return found


def tree(marks: list[str]) -> set[int]:
    """The processes whose command line names one of `marks`, and all their descendants (Ray's workers rename
    themselves `ray::...`; an actor's own children). Never this process."""
    ps = procs()
    mine = {pid for pid, (_, cmd) in ps.items() if any(m.encode() in cmd for m in marks)} - {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in ps.items() if ppid in mine} - mine
        mine |= more
        grew = bool(more)
    return mine


class LoopbackCluster:
    def __init__(self, cpus: int = 1, memory_mb: int = 1500, object_store_mb: int = 200,
                 env: dict[str, str] | None = None):
        self.dirs = [tempfile.mkdtemp(prefix="pipe-ray-test-") for _ in range(2)]
        # each node's object store maps its memory from files in a /dev/shm dir of its own: what is left is ours
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.shm = [tempfile.mkdtemp(prefix="pipe-ray-test-", dir=shm) for _ in range(2)]
        self.port = free_port(HEAD)
        self.address = f"{HEAD}:{self.port}"
        self.client = f"ray://{HEAD}:{free_port(HEAD)}"  # Ray Client's address (its server runs on the head)
        self.marks = [*self.dirs, self.address]  # what our processes' command lines name
        self.env = dict(os.environ, **ENV, **(env or {}))
        self.common = ["--num-cpus", str(cpus), "--memory", str(memory_mb << 20), "--object-store-memory",
                       str(object_store_mb << 20), "--disable-usage-stats"]

    def start(self) -> None:
        ray = str(Path(sys.executable).parent / "ray")
        subprocess.run([ray, "start", "--head", "--node-ip-address", HEAD, "--port", str(self.port),
                        "--temp-dir", self.dirs[0], "--plasma-directory", self.shm[0], "--include-dashboard", "false",
                        *self.common,
                        "--ray-client-server-port", self.client.rsplit(":", 1)[1],
                        "--min-worker-port", "20000", "--max-worker-port", "20999"],
                       env=self.env, check=True, capture_output=True, timeout=120)
        subprocess.run([ray, "start", "--address", self.address, "--node-ip-address", WORKER,
                        "--temp-dir", self.dirs[1], "--plasma-directory", self.shm[1], *self.common,
                        "--min-worker-port", "21000",
                        "--max-worker-port", "21999"], env=self.env, check=True, capture_output=True, timeout=120)

    def pids(self, named: bytes = b"") -> list[int]:
        """Our processes (whose command line holds `named`)."""
        ps = procs()
        return sorted(pid for pid in tree(self.marks) if named in ps.get(pid, (0, b""))[1])

    def stop(self) -> list[int]:
        """Kill every process of ours; returns the pids still alive after 20 s (none, normally). The files its
        object stores left in /dev/shm are then in `self.shm_left` (none, normally), and its dirs are removed."""
        for _ in range(3):  # a raylet may start a worker while we kill: look again
            for pid in tree(self.marks):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(1)
        deadline = time.monotonic() + 20
        while tree(self.marks) and time.monotonic() < deadline:
            time.sleep(0.5)
        left = sorted(tree(self.marks))
        self.shm_left = sorted(str(p) for d in self.shm for p in Path(d).rglob("*"))
        for d in (*self.dirs, *self.shm):
            shutil.rmtree(d, ignore_errors=True)
        return left

    def __enter__(self) -> "LoopbackCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
