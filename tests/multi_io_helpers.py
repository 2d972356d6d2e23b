"""The two-input, two-output example (examples/two_inputs.yaml: `img` [N,1,8,8] + `feat` [N,4] in, `embedding`
[N,16] + `logits` [N,4] out) trained briefly, exported with --onnx and packaged once per session, for the
package and Triton tests; and a compress artifact laid out as `pipe compress` writes it whose ONNX is made
from the legacy program (its inputs in reversed order: feat, img)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from pipeline import artifacts
from pipeline.cli import main

REPO = Path(__file__).resolve().parent.parent
YAML = REPO / "examples" / "two_inputs.yaml"
EPOCHS = 3  # measured test_acc ~0.8: a trained model, in ~10 s
_BUILT: dict[str, Path] = {}


@contextlib.contextmanager
def examples_importable() -> Iterator[None]:
    """The example's `module:factory` references resolve from the repo root, here and in child processes
    (export's legacy child); packaging draws the reference set from the example's data."""
    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(REPO))
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    try:
        yield
    finally:
        mp.undo()


def two_inputs_run(tmp_root: Path) -> Path:
    """train (EPOCHS), export --onnx and package (fp32, Paddle Inference, Triton repository) of the example."""
    if "run" not in _BUILT:
        run = tmp_root / "two-inputs"
        with examples_importable():
            assert main(["train", "--config", str(YAML), "--run", str(run), "--epochs", str(EPOCHS)]) == 0
            assert main(["export", str(run / "train"), "--onnx"]) == 0
            assert main(["package", str(run / "export"), "--engine", "paddle"]) == 0
        _BUILT["run"] = run
    return _BUILT["run"]


def legacy_onnx(run: Path, dest: Path) -> Path:
    """paddle2onnx of the export's legacy program (as the package stage runs it): inputs feat, img."""
    exp = run / "export"
    dest.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "paddle2onnx.command", "--model_dir", str(exp / "legacy"),
           "--model_filename", "model.pdmodel", "--params_filename", "model.pdiparams", "--save_file", str(dest),
           "--opset_version", "13", "--optimize_tool", "None"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=dest.parent, timeout=600, check=False,
                          env=dict(os.environ, POLYGRAPHY_AUTOINSTALL_DEPS="0"))
    assert proc.returncode == 0 and dest.is_file(), proc.stderr[-2000:]
    return dest


def stand_in_compress(run: Path, dest: Path) -> Path:
    """A compress artifact with the keys stages/compress.py writes, built in seconds from the export's own
    files: the legacy fp32 program stands in for int8-paddle (its numbers are not what is tested), the
    legacy-made ONNX for onnx-fp32 (as compress's paddle2onnx of the legacy program gives it)."""
    exp = artifacts.verify(run / "export", ("export",))
    onnx = legacy_onnx(run, dest.parent / f"{dest.name}-legacy-onnx" / "model.onnx")
    with artifacts.write_stage(dest, "compress", exp.manifest["config"], exp) as w:
        (w.dir / "int8-paddle").mkdir()
        for f in ("model.pdmodel", "model.pdiparams"):
            shutil.copyfile(run / "export/legacy" / f, w.dir / "int8-paddle" / f)
        (w.dir / "onnx-fp32").mkdir()
        shutil.copyfile(onnx, w.dir / "onnx-fp32/model.onnx")
        w.interface = exp.manifest["interface"]
        pd, ort = {"engine": "paddle_inference", "supported": True}, {"engine": "onnxruntime", "supported": True}
        w.metrics = {"variants": {
            "fp32": {**pd, "format": "pir", "precision": "fp32", "files": [], "source": "export", "accuracy": 0.8},
            "int8-paddle": {**pd, "format": "legacy", "precision": "int8", "source": "compress", "accuracy": 0.8,
                            "top1_agreement": 1.0,
                            "files": ["int8-paddle/model.pdmodel", "int8-paddle/model.pdiparams"]},
            "onnx-fp32": {**ort, "format": "onnx", "precision": "fp32", "source": "compress", "accuracy": 0.8,
                          "files": ["onnx-fp32/model.onnx"]},
        }}
    return dest
