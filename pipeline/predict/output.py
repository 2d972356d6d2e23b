"""`pipe predict`'s output directory: append-only rows, each item exactly once, resumable after any kill.

    DIR/predict.json       the fingerprint: the package's manifest sha256 and the settings that change an
                           answer (task, engine, precision, dpi, field); written once, atomically, at the first run
    DIR/predictions.jsonl  one row per item: {"source", "page", ["line",] "sha256", "answer"}
    DIR/errors.jsonl       one row per item that could not be read or run: {"source", "page", ["line",] "error"}
    DIR/summary.json       counts and speed of the last run (written atomically at its end)
    DIR/.lock              held (fcntl.flock) by the run writing here: a second run is refused naming its pid

Exactly once: an item is keyed by (source, page, line, sha256). At open, both files are read; a last line
without its newline (a write torn by a kill) is cut away; the keys found are skipped. Rows are appended as whole
lines, one write per batch, then flushed and fsynced: a kill loses at most the batch being written, which the
next run does again. The set of keys written is what a resume needs to know; it is the only thing here that
grows with the items (tens of bytes each).
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

from pipeline import artifacts
from pipeline.errors import InputError

PREDICTIONS = "predictions.jsonl"
ERRORS = "errors.jsonl"
SUMMARY = "summary.json"
FINGERPRINT = "predict.json"
LOCK = ".lock"
Key = tuple[str, Any, Any, str]


def row_key(row: dict[str, Any]) -> Key:
    return (row.get("source"), row.get("page"), row.get("line"), row.get("sha256") or "")


class Output:
    """DIR opened for appending: `done` (keys already written: predictions), `failed` (errors), `write`."""

    def __init__(self, out_dir: Path, fingerprint: dict[str, Any]):
        self.dir = Path(out_dir)
        if self.dir.exists() and not self.dir.is_dir():
            raise InputError(f"--out {self.dir}: exists and is not a folder")
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / LOCK, "a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "?"
            self._lock.close()
            raise InputError(f"--out {self.dir}: another pipe predict (pid {holder}) is writing there") from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(str(os.getpid()))
        self._lock.flush()
        try:
            self._check_fingerprint(fingerprint)
            self.done = _read_keys(self.dir / PREDICTIONS)
            self.failed = _read_keys(self.dir / ERRORS)
            self._pred = open(self.dir / PREDICTIONS, "ab")
            self._err = open(self.dir / ERRORS, "ab")
        except BaseException:
            self.close()
            raise

    def _check_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        path = self.dir / FINGERPRINT
        if path.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raise InputError(f"{path}: unreadable; this is no pipe predict output (use another --out)") from None
            diff = [k for k in sorted(set(old) | set(fingerprint)) if old.get(k) != fingerprint.get(k)]
            if diff:
                k = diff[0]
                raise InputError(f"--out {self.dir}: written by another package or settings ({k} {old.get(k)!r}, "
                                 f"now {fingerprint.get(k)!r}); resume with the same ones or use another --out")
            return
        if (self.dir / PREDICTIONS).exists() or (self.dir / ERRORS).exists():
            raise InputError(f"--out {self.dir}: holds rows but no {FINGERPRINT}; use another --out")
        artifacts.write_text_atomic(path, json.dumps(fingerprint, indent=2, sort_keys=True) + "\n")

    def write(self, rows: list[dict[str, Any]], errors: list[dict[str, Any]]) -> None:
        """One batch's rows, each file appended with one write of whole lines, flushed and fsynced."""
        for f, items, keys in ((self._pred, rows, self.done), (self._err, errors, self.failed)):
            if not items:
                continue
            data = b"".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
                            for r in items)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            keys.update(row_key(r) for r in items)

    def summary(self, doc: dict[str, Any]) -> None:
        artifacts.write_text_atomic(self.dir / SUMMARY, json.dumps(doc, indent=2) + "\n")

    def close(self) -> None:
        for name in ("_pred", "_err"):
            f = getattr(self, name, None)
            if f is not None:
                f.close()
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def _read_keys(path: Path) -> set[Key]:
    """The keys of a rows file's whole lines; a torn last line (no newline: a write cut by a kill) is cut off
    the file, so the next append starts on a line of its own."""
    keys: set[Key] = set()
    if not path.exists():
        return keys
    good = 0
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            try:
                row = json.loads(raw)
            except ValueError:
                raise InputError(f"{path}: line {len(keys) + 1} is not JSON (edited by hand?); use another "
                                 "--out") from None
            keys.add(row_key(row))
            good += len(raw)
    if good != path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(good)
            f.flush()
            os.fsync(f.fileno())
    return keys
