"""Fine-tuning from given weights (`model.init`, `pipe train --init`): real CPU training on the built-in
digits data and a 3-class subset of it. A matching init is the source's weights before the first step
(shown at lr 0 with the MLP, which has no BatchNorm statistics to move); a new head keeps its fresh init
and trains; strict mode, bad sources and a crafted pickle exit 2 before anything is written; the
manifest and `pipe inspect` carry the source's sha256; resume refuses a changed init."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline import artifacts, runtime
from pipeline.cli import main
from pipeline.errors import InputError
from tests.conftest import REPO

DIGITS = REPO / "examples" / "digits.yaml"
FROZEN = ("--set", "train.lr=0", "--set", "train.weight_decay=0")  # AdamW at lr 0 moves nothing: p - 0 * u
MLP_TENSORS = ["1.weight", "1.bias", "3.weight", "3.bias"]  # Flatten, Linear(64, 64), ReLU, Linear(64, K)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A 1-epoch MLP digits run (10 classes): the weights every test starts from."""
    run = tmp_path_factory.mktemp("init-source")
    assert main(["train", "--config", str(DIGITS), "--run", str(run), "--model", "mlp", "--epochs", "1"]) == 0
    return run / "train"


@pytest.fixture(scope="module")
def three_classes(tmp_path_factory) -> Path:
    """Digits 0, 1 and 2 only, as an .npz (x, y; pipe splits it)."""
    with np.load(REPO / "pipeline" / "assets" / "digits.npz") as z:
        x, y = z["x"], z["y"]
    keep = y < 3
    path = tmp_path_factory.mktemp("three") / "three.npz"
    np.savez(path, x=x[keep], y=y[keep])
    return path


def _arrays(path: Path) -> dict[str, np.ndarray]:
    paddle = runtime.import_paddle()
    return {k: v.numpy() for k, v in runtime.load_safetensors(paddle, path).items()}


def _init_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "model.init" in line]


def _nothing_written(run: Path) -> bool:
    """The run directory holds at most the job lock (taken before training starts)."""
    return not run.exists() or {p.name for p in run.iterdir()} <= {".lock"}


def _write_pdparams(state: Path, dest: Path, protocol: int) -> Path:
    paddle = runtime.import_paddle()
    paddle.save(runtime.load_safetensors(paddle, state), str(dest), protocol=protocol)
    return dest


@pytest.mark.parametrize("kind", ["train", "safetensors", "pdparams", "pdparams-protocol2"])
def test_a_matching_init_is_the_source_before_the_first_step(tmp_path, cli, source, kind):
    init = {"train": lambda: source,
            "safetensors": lambda: Path(shutil.copyfile(source / "model.safetensors", tmp_path / "w.safetensors")),
            "pdparams": lambda: _write_pdparams(source / "model.safetensors", tmp_path / "w.pdparams", 4),
            "pdparams-protocol2": lambda: _write_pdparams(source / "model.safetensors", tmp_path / "w.pdparams", 2),
            }[kind]()
    run = tmp_path / "run"
    code, _, err = cli("train", "--config", DIGITS, "--run", run, "--model", "mlp", "--epochs", "1", *FROZEN,
                       "--init", init, "--set", "model.init_strict=true")
    assert code == 0, err
    assert _init_lines(err) == [f"note: model.init {init}: loaded 4 of 4 tensors; every tensor matched"]
    want, got = _arrays(source / "model.safetensors"), _arrays(run / "train" / "model.safetensors")
    assert sorted(got) == sorted(want) == sorted(MLP_TENSORS)
    for name in MLP_TENSORS:
        np.testing.assert_array_equal(got[name], want[name])
    m = artifacts.verify(run / "train", ("train",)).manifest
    file = init / "model.safetensors" if kind == "train" else init
    rec = {"path": str(init.resolve()), "kind": kind.split("-")[0], "sha256": artifacts.sha256_file(file),
           "loaded": 4, "shape_mismatch": [], "missing": [], "unexpected": []}
    if kind == "train":
        rec["manifest_sha256"] = hashlib.sha256((source / "manifest.json").read_bytes()).hexdigest()
    assert m["init"] == rec
    assert m["config"]["model"]["init"] == str(init) and m["input"] is None


def test_without_init_the_same_frozen_run_differs_from_the_source(tmp_path, cli, source):
    """The control of the test above: at lr 0 a run keeps its random init, which is not the source's."""
    code, _, err = cli("train", "--config", DIGITS, "--run", tmp_path, "--model", "mlp", "--epochs", "1", *FROZEN)
    assert code == 0, err
    want, got = _arrays(source / "model.safetensors"), _arrays(tmp_path / "train" / "model.safetensors")
    assert not any(np.array_equal(got[n], want[n]) for n in MLP_TENSORS)
    assert "init" not in json.loads((tmp_path / "train" / "manifest.json").read_text())


def test_batchnorm_parameters_load_and_only_the_running_statistics_move(tmp_path, cli, trained_digits):
    """digits_cnn at lr 0: every parameter is the source's; BatchNorm's running mean and variance are
    buffers that follow the data in training mode whatever the LR, so those (and only those) move."""
    code, _, err = cli("train", "--config", DIGITS, "--run", tmp_path, "--epochs", "1", *FROZEN,
                       "--init", trained_digits / "train")
    assert code == 0, err
    want = _arrays(trained_digits / "train" / "model.safetensors")
    got = _arrays(tmp_path / "train" / "model.safetensors")
    stats = [n for n in want if n.endswith(("._mean", "._variance"))]
    assert len(stats) == 6 and sorted(got) == sorted(want)
    for name in want:
        assert np.array_equal(got[name], want[name]) == (name not in stats), name


def test_a_new_head_keeps_its_fresh_init_and_trains(tmp_path, cli, source, three_classes):
    args = ("train", "--config", DIGITS, "--data", three_classes, "--model", "mlp", "--epochs", "1",
            "--init", source)
    code, _, err = cli(*args, "--run", tmp_path / "frozen", *FROZEN)
    assert code == 0, err
    assert _init_lines(err) == [
        f"note: model.init {source}: loaded 2 of 4 tensors; 2 shape/dtype mismatch, fresh init kept: "
        "3.weight (shape [64, 10] in the file, [64, 3] in the model), "
        "3.bias (shape [10] in the file, [3] in the model)"]
    code, _, err = cli(*args, "--run", tmp_path / "trained")
    assert code == 0, err
    src = _arrays(source / "model.safetensors")
    frozen = _arrays(tmp_path / "frozen" / "train" / "model.safetensors")
    trained = _arrays(tmp_path / "trained" / "train" / "model.safetensors")
    for name in ("1.weight", "1.bias"):  # the body came from the source, then trained on
        np.testing.assert_array_equal(frozen[name], src[name])
        assert not np.array_equal(trained[name], src[name])
    assert frozen["3.weight"].shape == trained["3.weight"].shape == (64, 3)
    for name in ("3.weight", "3.bias"):  # the fresh head (what lr 0 kept), changed by training
        assert not np.array_equal(trained[name], frozen[name])
    m = json.loads((tmp_path / "trained" / "train" / "manifest.json").read_text())
    assert (m["init"]["loaded"], m["init"]["shape_mismatch"], m["init"]["missing"], m["init"]["unexpected"]) == \
        (2, ["3.weight", "3.bias"], [], [])
    # 5 steps of warm-up from a 57%-accurate 10-class source: 0.84 measured, chance is 1/3
    assert m["interface"]["labels"] == ["0", "1", "2"] and m["metrics"]["test_acc"] > 0.6


def test_strict_refuses_a_mismatch_before_writing(tmp_path, cli, source, three_classes):
    run = tmp_path / "run"
    code, out, err = cli("train", "--config", DIGITS, "--data", three_classes, "--model", "mlp", "--run", run,
                         "--init", source, "--set", "model.init_strict=true")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"pipe train: error: model.init {source}: model.init_strict: 3.weight: shape [64, 10] in the file, "
        "[64, 3] in the model (2 shape/dtype mismatch, 0 missing, 0 unexpected of 4 model tensors)"]
    assert _nothing_written(run)


def _tampered(tmp_path: Path, source: Path) -> Path:
    copy = tmp_path / "tampered" / "train"
    shutil.copytree(source, copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    return copy


@pytest.mark.parametrize("case, expect", [
    ("missing", "{p}: no such file or directory"),
    ("extension", "{p}: expected a .safetensors or .pdparams state dict, or a train artifact directory"),
    ("tampered", "model.init: {p}/manifest.json: sha256 mismatch for model.safetensors"),
    ("checkpoint", "model.init: {p}/manifest.json: stage is 'checkpoint', expected train"),
    ("not-safetensors", "{p}: not a safetensors file"),
    ("not-pickle", "model.init {p}: not a readable .pdparams state dict"),
    ("optimizer-state", "model.init {p}: entry 'LR_Scheduler' is a dict, not a numeric tensor"),
    ("other-model", "model.init {p}: no tensor matches the model (0 shape/dtype mismatch, 4 missing, 1 unexpected"),
])
def test_a_bad_source_exits_2_in_one_line_before_writing(tmp_path, cli, source, case, expect):
    paddle = runtime.import_paddle()
    p = {"missing": lambda: tmp_path / "nope.safetensors",
         "extension": lambda: Path(shutil.copyfile(source / "model.safetensors", tmp_path / "w.pt")),
         "tampered": lambda: _tampered(tmp_path, source),
         "checkpoint": lambda: source.parent / "checkpoints" / (source.parent / "checkpoints" / "last").read_text().strip(),
         "not-safetensors": lambda: Path(shutil.copyfile(DIGITS, tmp_path / "w.safetensors")),
         "not-pickle": lambda: Path(shutil.copyfile(DIGITS, tmp_path / "w.pdparams")),
         }.get(case, lambda: tmp_path / "w.pdparams")()
    if case == "optimizer-state":
        paddle.save({"x.w": paddle.ones([2]), "LR_Scheduler": {"last_epoch": 3}}, str(p))
    elif case == "other-model":
        paddle.save({"fc.weight": paddle.ones([2, 2])}, str(p))
    run = tmp_path / "run"
    code, _, err = cli("train", "--config", DIGITS, "--model", "mlp", "--run", run, "--init", p)
    assert code == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and expect.format(p=p) in err, err
    assert _nothing_written(run)


class _Payload:
    """Unpickling this runs its command: proof that code ran."""

    def __init__(self, call: tuple):
        self.call = call

    def __reduce__(self):
        return self.call


@pytest.mark.parametrize("how", ["Path.touch", "os.system"])
def test_a_crafted_pdparams_is_refused_and_never_runs(tmp_path, cli, source, how):
    marker = tmp_path / "PWNED"
    call = {"Path.touch": (Path.touch, (marker,)), "os.system": (os.system, (f"touch {marker}",))}[how]
    state = {n: v for n, v in _arrays(source / "model.safetensors").items()}  # a real state dict ...
    state["3.bias"] = _Payload(call)  # ... with one poisoned entry
    bad = tmp_path / "w.pdparams"
    bad.write_bytes(pickle.dumps(state, protocol=4))
    run = tmp_path / "run"
    code, _, err = cli("train", "--config", DIGITS, "--model", "mlp", "--run", run, "--init", bad)
    glob = {"Path.touch": "pathlib.Path.touch", "os.system": "posix.system"}[how]
    assert code == 2 and err.strip().splitlines() == [
        f"pipe train: error: model.init {bad}: refused to unpickle global {glob} (a .pdparams may only hold "
        "numpy arrays)"]
    assert not marker.exists() and _nothing_written(run)


def test_protocol_2_bytes_are_decoded_as_latin1_only(tmp_path):
    from pipeline.nets import weights

    good = pickle.dumps({"w": np.arange(3, dtype=np.float32)}, protocol=2)
    assert b"_codecs" in good
    np.testing.assert_array_equal(weights._unpickle_state_dict(good, tmp_path / "w.pdparams")["w"], [0, 1, 2])
    bad = good.replace(b"latin1", b"rot_13")  # same length: the pickle stays well formed
    with pytest.raises(InputError, match="not a readable .pdparams state dict"):
        weights._unpickle_state_dict(bad, tmp_path / "w.pdparams")


def test_the_manifest_and_inspect_carry_the_sources_sha256(tmp_path, cli, source):
    src = tmp_path / "src" / "train"
    shutil.copytree(source, src)
    run = tmp_path / "run"
    assert cli("train", "--config", DIGITS, "--model", "mlp", "--epochs", "1", "--run", run, "--init", src)[0] == 0
    sha = artifacts.sha256_file(src / "model.safetensors")
    line = (f"init   {src.resolve()} (train, sha256 {sha[:12]}): loaded 4, 0 shape/dtype mismatch, 0 missing, "
            "0 unexpected")
    code, out, err = cli("inspect", run / "train")
    assert code == 0, err
    assert line in out.splitlines()
    code, out, _ = cli("inspect", run / "train", "--verify")
    assert f"{line}  [verified]" in out.splitlines()
    (src / "metrics.csv").write_text("changed\n")
    code, out, _ = cli("inspect", run / "train", "--verify")
    assert f"{line}  [{src.resolve()}/manifest.json: size mismatch for metrics.csv" in out


def test_resume_keeps_the_checkpoint_and_refuses_a_changed_init(tmp_path, cli, source):
    # a constant LR after the warm-up: raising train.epochs on resume leaves the first epoch's schedule as it was
    base = ("train", "--config", DIGITS, "--model", "mlp", "--init", source, "--set", "train.schedule=constant")
    assert cli(*base, "--run", tmp_path / "full", "--epochs", "2")[0] == 0
    part = tmp_path / "part"
    assert cli(*base, "--run", part, "--epochs", "1")[0] == 0
    other = Path(shutil.copyfile(source / "model.safetensors", tmp_path / "w.safetensors"))
    for init in (other, ""):
        code, _, err = cli(*base[:-3], init, *base[-2:], "--run", part, "--epochs", "2", "--resume", "auto")
        assert code == 2 and err.strip().splitlines() == [
            f"pipe train: error: --resume {part / 'checkpoints' / 'step-000019'}: model.init was {str(source)!r}, "
            f"now {str(init)!r}; it changes the model or the data, start a new run instead"]
    code, _, err = cli(*base, "--run", part, "--epochs", "2", "--resume", "auto")
    assert code == 0, err
    # the init is applied, then the checkpoint's weights replace it: the resumed run is the uninterrupted one
    full, resumed = (tmp_path / "full" / "train" / "model.safetensors"), (part / "train" / "model.safetensors")
    assert resumed.read_bytes() == full.read_bytes()
