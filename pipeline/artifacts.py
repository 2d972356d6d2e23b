"""The artifact contract every stage (and every checkpoint) follows.

A stage directory is complete and verifiable, or absent:
files are written into `<target>.tmp-<pid>/` beside the target, fsynced, `manifest.json` is
written last (it is the commit marker), the directory is renamed into place and the parent fsynced.
A reader checks the manifest, the stage kind and every file's bytes and sha256 before using any.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

from pipeline import __version__
from pipeline.errors import InputError

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
_REQUIRED = ("schema_version", "stage", "created", "versions", "config", "input", "files", "metrics", "interface")


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync(path: Path) -> None:
    """fsync a file or a directory (after a rename in it) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _walk_files(root: Path) -> Iterator[Path]:
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            yield Path(dirpath) / name


def versions() -> dict[str, str]:
    """Versions recorded in every manifest. Reads package metadata: never imports paddle."""
    return dict(_versions())


@functools.lru_cache(maxsize=1)
def _versions() -> dict[str, str]:
    """Computed once per process: a manifest is written per stage and the git SHA does not change meanwhile."""
    out = {"pipe": __version__, "python": platform.python_version()}
    for dist in ("paddlepaddle", "paddlepaddle-gpu", "numpy", "paddleslim", "onnxruntime", "openvino"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        sha = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    if sha:
        out["git_sha"] = sha
    return out


@dataclass
class Artifact:
    """A verified stage directory."""

    path: Path
    manifest: dict[str, Any]
    manifest_sha256: str

    @property
    def stage(self) -> str:
        return self.manifest["stage"]

    def file(self, name: str) -> Path:
        if name not in self.manifest["files"]:
            raise InputError(f"{self.path / MANIFEST}: lists no file {name}")
        return self.path / name


@dataclass
class StageWriter:
    """Collects what a stage produces; `commit` makes it visible atomically.

    Use through `write_stage(...)`: files go in `self.dir`, results in `metrics` and `interface`.
    """

    target: Path
    stage: str
    config: dict[str, Any]
    input: Artifact | None
    dir: Path = field(init=False)
    metrics: dict[str, Any] = field(default_factory=dict)
    interface: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dir = self.target.parent / f"{self.target.name}.tmp-{os.getpid()}"

    def _manifest(self) -> dict[str, Any]:
        files = {}
        for path in _walk_files(self.dir):
            rel = path.relative_to(self.dir).as_posix()
            if rel == MANIFEST:
                continue
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            files[rel] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
        inp = None
        if self.input is not None:
            inp = {
                "path": os.path.relpath(self.input.path.resolve(), self.target.resolve()),
                "stage": self.input.stage,
                "manifest_sha256": self.input.manifest_sha256,
            }
        return {
            "schema_version": SCHEMA_VERSION,
            "stage": self.stage,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": versions(),
            "device": describe_device(),
            "config": self.config,
            "input": inp,
            "files": files,
            "metrics": self.metrics,
            "interface": self.interface,
            **self.extra,
        }

    def commit(self) -> Path:
        manifest = self._manifest()
        _write_json_durable(self.dir / MANIFEST, manifest)
        fsync(self.dir)
        old = None
        if self.target.exists():
            # The old artifact stays whole until the new one is in place.
            old = self.target.parent / f"{self.target.name}.old-{os.getpid()}"
            os.replace(self.target, old)
        os.replace(self.dir, self.target)
        fsync(self.target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.target


class write_stage:
    """Context manager: `with write_stage(out, "train", cfg, inp) as w: ...` commits on success
    and removes the temporary directory on any exception, leaving the target untouched."""

    def __init__(self, target: Path, stage: str, config: dict[str, Any], input: Artifact | None = None):
        self.writer = StageWriter(Path(target), stage, config, input)

    def __enter__(self) -> StageWriter:
        w = self.writer
        w.target.parent.mkdir(parents=True, exist_ok=True)
        if w.dir.exists():
            shutil.rmtree(w.dir)
        w.dir.mkdir()
        return w

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            try:
                self.writer.commit()
            except BaseException:
                shutil.rmtree(self.writer.dir, ignore_errors=True)
                raise
        else:
            shutil.rmtree(self.writer.dir, ignore_errors=True)
        return False


def _write_json_durable(path: Path, doc: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def write_text_atomic(path: Path, text: str) -> None:
    """Replace a small file (a `last`/`best` pointer) atomically."""
    tmp = path.parent / f"{path.name}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync(path.parent)


def verify(path: Path, stages: tuple[str, ...]) -> Artifact:
    """Check a stage directory before anything is read from it. Raises InputError naming the file."""
    path = Path(path)
    if ".tmp-" in path.name:
        raise InputError(f"{path}: an unfinished temporary directory, not an artifact")
    if not path.is_dir():
        raise InputError(f"{path}: no such artifact directory")
    mpath = path / MANIFEST
    try:
        raw = mpath.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{mpath}: missing (not a pipe artifact, or an interrupted write)") from None
    try:
        manifest = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InputError(f"{mpath}: not valid JSON") from None
    if not isinstance(manifest, dict) or any(k not in manifest for k in _REQUIRED):
        missing = [k for k in _REQUIRED if not isinstance(manifest, dict) or k not in manifest]
        raise InputError(f"{mpath}: missing field {missing[0]}")
    if manifest["schema_version"] != SCHEMA_VERSION:
        raise InputError(f"{mpath}: schema_version {manifest['schema_version']!r}, this pipe reads {SCHEMA_VERSION}")
    if manifest["stage"] not in stages:
        want = " or ".join(stages)
        raise InputError(f"{mpath}: stage is '{manifest['stage']}', expected {want}")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise InputError(f"{mpath}: files must be a mapping")
    for rel, info in sorted(files.items()):
        if not isinstance(info, dict):
            raise InputError(f"{mpath}: entry for {rel} must be a mapping with sha256 and bytes")
        fpath = path / rel
        if not fpath.is_file():
            raise InputError(f"{mpath}: missing file {rel}")
        size = fpath.stat().st_size
        if size != info.get("bytes"):
            raise InputError(f"{mpath}: size mismatch for {rel} ({size} bytes, manifest says {info.get('bytes')})")
        if sha256_file(fpath) != info.get("sha256"):
            raise InputError(f"{mpath}: sha256 mismatch for {rel}")
    for fpath in _walk_files(path):
        rel = fpath.relative_to(path).as_posix()
        if rel != MANIFEST and rel not in files:
            raise InputError(f"{mpath}: unexpected file {rel} (not in the manifest)")
    manifest["metrics"] = current_names(manifest["metrics"])
    return Artifact(path=path, manifest=manifest, manifest_sha256=hashlib.sha256(raw).hexdigest())


_RENAMED_SUFFIXES = {"_bs32": "_batch"}  # older manifests' name -> this pipe's: `items_per_s_bs32` held items/s at
# the variant's `throughput_batch`, 32 or not


def current_names(doc: Any) -> Any:
    """A manifest's metrics with the keys an older pipe wrote under another name renamed, at every depth (the
    variants' own metrics sit a level or two down); the bytes on disk, and so the manifest's sha256, unchanged."""
    if isinstance(doc, dict):
        return {_current_key(k): current_names(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [current_names(v) for v in doc]
    return doc


def _current_key(key: Any) -> Any:
    if isinstance(key, str):
        for old, new in _RENAMED_SUFFIXES.items():
            if key.endswith(old):
                return key[: -len(old)] + new
    return key


def lineage(art: Artifact, check: bool = True) -> list[tuple[Artifact | None, str]]:
    """The chain from `art` back to training: [(artifact, note)], newest first.

    With `check`, each input is verified and its manifest hash compared with the one recorded."""
    chain: list[tuple[Artifact | None, str]] = [(art, "")]
    cur = art
    while cur.manifest.get("input"):
        ref = cur.manifest["input"]
        if not isinstance(ref, dict) or not all(isinstance(ref.get(k), str) for k in ("path", "stage")):
            chain.append((None, f"{cur.path / MANIFEST}: malformed input field"))
            break
        p = (cur.path / ref["path"]).resolve()
        try:
            parent = verify(p, (ref["stage"],)) if check else _load_unchecked(p)
        except InputError as e:
            chain.append((None, str(e)))
            break
        note = ""
        if parent.manifest_sha256 != ref["manifest_sha256"]:
            note = "changed since it was used (re-run the later stages)"
        chain.append((parent, note))
        cur = parent
    return chain


def _load_unchecked(path: Path) -> Artifact:
    mpath = path / MANIFEST
    try:
        raw = mpath.read_bytes()
        return Artifact(path, json.loads(raw), hashlib.sha256(raw).hexdigest())
    except (OSError, json.JSONDecodeError):
        raise InputError(f"{mpath}: missing or not valid JSON") from None


def describe_device() -> str:
    """Device string for the manifest without importing paddle when it is not loaded yet."""
    paddle = sys.modules.get("paddle")
    if paddle is None:
        return "unknown"
    return str(paddle.device.get_device())
