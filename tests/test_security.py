"""RELIABILITY.md section 6: no foreign pickles, safe parsing only."""

from __future__ import annotations

import hashlib
import json
import pickle
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO

# Code that would unpickle or evaluate: none of it may appear in pipe's own modules.
_UNSAFE = re.compile(r"^\s*(import pickle|from pickle import)|\bpickle\.(loads?|Unpickler)\(|"
                     r"allow_pickle\s*=\s*True|\byaml\.load\(|(?<![\w.])eval\(|(?<![\w.])exec\(")


# The one exception: pipeline/nets/weights.py imports pickle for its restricted unpickler of `.pdparams`
# (model.init), whose find_class admits only the numpy globals of a state dict; it is used as
# `_Restricted(f, path).load()`, and tests/stages/test_init.py proves a crafted pickle is refused unrun.
_ALLOWED = {("pipeline/nets/weights.py", "import pickle  # for _Restricted only: the one unpickler in pipe "
                                    "(tests/test_security.py)")}


def test_no_unpickling_or_eval_in_pipe():
    hits = []
    for path in sorted([*REPO.glob("pipeline/*.py"), *REPO.glob("stages/*.py")]):
        rel = path.relative_to(REPO).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _UNSAFE.search(line) and (rel, line.strip()) not in _ALLOWED:
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert hits == []


def test_the_one_unpickler_is_restricted():
    from pipeline.nets import weights

    assert weights._Restricted.find_class is not pickle.Unpickler.find_class
    assert weights._ALLOWED_GLOBALS == {("numpy.core.multiarray", "_reconstruct"),
                                        ("numpy._core.multiarray", "_reconstruct"),
                                        ("numpy", "ndarray"), ("numpy", "dtype")}


class _Payload:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _rehash(ckpt: Path) -> None:
    """Rewrite the manifest's hashes, as an attacker able to write the directory would."""
    m = json.loads((ckpt / "manifest.json").read_text())
    for name in m["files"]:
        data = (ckpt / name).read_bytes()
        m["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (ckpt / "manifest.json").write_text(json.dumps(m))


@pytest.mark.parametrize("victim", ["model.safetensors", "optimizer.safetensors"])
def test_a_crafted_pickle_checkpoint_is_refused_before_it_runs(tmp_path, cli, trained_digits, victim):
    run = tmp_path / "run"
    shutil.copytree(trained_digits, run)
    ckpt = run / "checkpoints" / (run / "checkpoints" / "last").read_text().strip()
    marker = tmp_path / "PWNED"
    (ckpt / victim).write_bytes(pickle.dumps({"w": _Payload(marker)}))
    _rehash(ckpt)
    code, _, err = cli("train", "--config", REPO / "examples/digits.yaml", "--run", run, "--epochs", "3",
                       "--resume", ckpt)
    assert code == 2 and f"{victim}: not a safetensors file" in err
    assert not marker.exists()


def test_a_crafted_pickle_weights_file_is_refused_by_export(tmp_path, cli, trained_digits):
    run = tmp_path / "run"
    shutil.copytree(trained_digits, run)
    marker = tmp_path / "PWNED"
    (run / "train" / "model.safetensors").write_bytes(pickle.dumps({"w": _Payload(marker)}))
    _rehash(run / "train")
    code, _, err = cli("export", run / "train")
    assert code == 2 and "model.safetensors: not a safetensors file" in err
    assert not marker.exists() and not (run / "export").exists()
