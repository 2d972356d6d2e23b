"""The pretrained cache is shared by test workers, the bench and users: one fetch at a time, and a process that
waited for another's fetch uses its files instead of replacing a directory someone is already reading."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import pretrained

pytestmark = pytest.mark.slow(reason="fetches the real PP-OCRv4 models in two processes")
REPO = Path(__file__).resolve().parent.parent


def test_a_second_process_waits_for_the_fetch_and_keeps_its_files(ppocr, tmp_path):
    root = tmp_path / "pretrained" / ppocr.name
    root.parent.mkdir(parents=True)
    script = "import sys; from pathlib import Path; from pipeline import pretrained; print(pretrained.ppocr(Path(sys.argv[1])))"
    with open(root.parent / ".fetch.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # this process is "fetching"
        child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(REPO)))
        time.sleep(2)
        assert child.poll() is None, child.communicate()  # it waits on the lock: it neither fetched nor returned
        for rel in pretrained._MEMBERS.values():  # our fetch commits the files (hard links: no copy, same inodes)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.link(ppocr / rel, root / rel)
        inodes = {rel: (root / rel).stat().st_ino for rel in pretrained._MEMBERS.values()}
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert out.strip() == str(root)
    assert {rel: (root / rel).stat().st_ino for rel in pretrained._MEMBERS.values()} == inodes  # not replaced
    assert not list(root.parent.glob(".fetch-*"))  # and nothing downloaded beside them
