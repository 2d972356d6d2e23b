"""VisualDL scalars of `pipe train` (pipeline/vdl.py), read back with VisualDL's own LogReader: they
equal metrics.csv and steps.csv, a crash and two resumes leave each step once with the uninterrupted
run's values, 2 ranks write one run, and a rewrite interrupted by a crash loses nothing."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import vdl
from tests.conftest import REPO

DIGITS = REPO / "examples" / "digits.yaml"
PIPE = [sys.executable, "-m", "pipeline.cli"]
SPE = 1259 // 64  # digits steps per epoch
STEP_TAGS = ["train/loss", "train/lr", "train/samples_per_s"]


def _records(run: Path) -> dict[str, list[tuple[int, int, float]]]:
    """(step, walltime, value) per tag of the run's one VisualDL file, in file order."""
    from visualdl import LogReader

    files = sorted(p.name for p in (run / "vdl").iterdir())
    assert len(files) == 1 and files[0].startswith("vdlrecords."), files
    reader = LogReader(file_path=str(run / "vdl" / files[0]))
    return {tag: [(v.id, v.timestamp, v.value) for v in reader.get_data("scalar", tag)]
            for tag in reader.get_tags()["scalar"]}


def _curve(recs: dict[str, list[tuple[int, int, float]]], tag: str) -> dict[int, float]:
    steps = [s for s, _, _ in recs[tag]]
    assert len(steps) == len(set(steps)), f"{tag}: a step appears twice: {steps}"
    return {s: v for s, _, v in recs[tag]}


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _f32(v: str) -> float:
    return float(np.float32(float(v)))  # VisualDL stores float32: the csv's value rounded once


def test_scalars_equal_metrics_and_steps_csv(tmp_path, cli):
    run = tmp_path / "run"
    (run / "vdl").mkdir(parents=True)
    (run / "vdl" / "vdlrecords.999999.log").write_bytes(b"an earlier run's")  # a fresh run starts empty
    code, _, err = cli("train", "--config", DIGITS, "--run", run, "--epochs", "2", "--model", "mlp",
                       "--set", "train.log_interval=4")
    assert code == 0, err
    assert f"training curves: visualdl --logdir {run / 'vdl'}" in err
    assert err.count("visualdl --logdir") == 1
    recs = _records(run)
    assert sorted(recs) == sorted(STEP_TAGS + ["val/loss", "val/acc"])  # no amp/loss_scale: the scaler is off
    steps = {int(r["step"]): r for r in _csv(run / "train" / "steps.csv")}
    logged = list(range(4, 2 * SPE + 1, 4))
    for tag, key in (("train/loss", "loss"), ("train/lr", "lr")):
        assert _curve(recs, tag) == {s: _f32(steps[s][key]) for s in logged}, tag  # exact: the same float32
    ips = _curve(recs, "train/samples_per_s")
    assert list(ips) == logged and all(0 < v < 1e7 for v in ips.values())
    epochs = _csv(run / "train" / "metrics.csv")
    assert [int(r["step"]) for r in epochs] == [SPE, 2 * SPE]
    for tag, key in (("val/loss", "val_loss"), ("val/acc", "val_acc")):
        assert _curve(recs, tag) == {int(r["step"]): _f32(r[key]) for r in epochs}, tag
    # metrics.csv's lr is read after the epoch's last scheduler step: the LR of the next step (20, logged)
    assert _curve(recs, "train/lr")[SPE + 1] == _f32(epochs[0]["lr"])
    wall = [w for tag in recs for _, w, _ in recs[tag]]
    assert all(w > 1.6e12 for w in wall)  # milliseconds since the epoch


def test_crash_and_resumes_continue_the_curves_without_duplicates(tmp_path, cli, monkeypatch):
    full, part = tmp_path / "full", tmp_path / "part"
    args = ["train", "--config", DIGITS, "--epochs", "2", "--model", "mlp",
            "--set", "train.checkpoint_every=5", "--set", "train.log_interval=2"]
    assert cli(*args, "--run", full)[0] == 0
    # 1. killed right after committing step 25: everything logged up to it is on disk
    env = dict(os.environ, PIPE_FAULT_CRASH_AFTER_STEP="25")
    crashed = subprocess.run([*PIPE, *args, "--run", part], env=env, capture_output=True, timeout=300)
    assert crashed.returncode == 137, crashed.stderr[-2000:]
    first = _records(part)
    assert list(_curve(first, "train/loss")) == list(range(2, 25, 2))
    # 2. resumed from 25, it dies at 35 (a NaN weight blocks that checkpoint): steps 26-34 are logged,
    #    the last checkpoint is 30
    monkeypatch.setenv("PIPE_FAULT_NAN_PARAMS_AT_STEP", "35")
    code, _, err = cli(*args, "--run", part, "--resume", "auto")
    assert code == 3 and "step-000030" in err, err
    assert list(_curve(_records(part), "train/loss")) == list(range(2, 35, 2))
    # 3. resumed from 30: 32 and 34 are dropped and logged again, once
    monkeypatch.delenv("PIPE_FAULT_NAN_PARAMS_AT_STEP")
    code, _, err = cli(*args, "--run", part, "--resume", "auto")
    assert code == 0, err
    assert "step-000030" in err and err.count("visualdl --logdir") == 1
    a, b = _records(full), _records(part)
    assert sorted(a) == sorted(b)
    for tag in a:
        if tag != "train/samples_per_s":  # a rate: it depends on the machine's load
            assert _curve(b, tag) == _curve(a, tag), tag
    assert list(_curve(b, "train/samples_per_s")) == list(_curve(a, "train/samples_per_s"))
    # what the crashed process logged keeps its wall times; the steps logged after a resume come later
    kept = {s: w for s, w, _ in b["train/loss"]}
    assert {s: w for s, w, _ in first["train/loss"]} == {s: kept[s] for s in range(2, 25, 2)}
    assert [s for s, _, _ in b["train/loss"]] == list(range(2, 2 * SPE + 1, 2))
    assert all(kept[s] >= kept[24] for s in range(26, 2 * SPE + 1, 2))


@pytest.mark.slow
def test_two_ranks_write_one_run(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    code, _, err = cli("train", "--config", DIGITS, "--run", run, "--epochs", "1", "--model", "mlp",
                       "--nproc", "2", "--set", "train.log_interval=3")
    assert code == 0, err
    assert err.count("visualdl --logdir") == 1 and str(run.resolve() / "vdl") in err  # rank 0's, via events.jsonl
    recs = _records(run)  # one file: rank 1 wrote nothing
    steps = {int(r["step"]): r for r in _csv(run / "train" / "steps.csv")}
    assert _curve(recs, "train/loss") == {s: _f32(steps[s]["loss"]) for s in range(3, SPE + 1, 3)}
    assert list(_curve(recs, "val/acc")) == [SPE]
    assert not list((run / "logs").rglob("*vdlrecords*"))


def test_help_does_not_import_visualdl():
    code = ("import sys; from pipeline.cli import main; main(['--help']); main(['train', '--help']); "
            "print('visualdl' in sys.modules, 'paddle' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False False"


# ---- pipeline/vdl.py alone (no training)

def _write(d: Path, name: str, steps: range) -> None:
    from visualdl import LogWriter

    w = LogWriter(logdir=str(d), file_name=name)
    for s in steps:
        w.add_scalar(tag="train/loss", value=1.0 / s, step=s, walltime=1_000 + s)
    w.close()


def _loss(d: Path) -> list[tuple[int, int, float]]:
    return _records(d.parent)["train/loss"]


def test_a_rewrite_cut_short_by_a_crash_loses_nothing(tmp_path):
    d = tmp_path / "vdl"
    _write(d, "vdlrecords.000001.log", range(1, 31))
    # a resume died while copying: the old file is still there beside its partial copy
    _write(d, "vdlrecords.000002.log", range(1, 9))
    torn = d / "vdlrecords.000002.log"
    torn.write_bytes(torn.read_bytes()[:-7])  # ... whose last record was half written
    notes: list[dict] = []
    s = vdl.open_run(d, 20, notes.append)
    s.step(21, 0.5, 0.1, 99.0)
    s.close()
    assert sorted(p.name for p in d.iterdir()) == ["vdlrecords.000003.log"]
    got = _loss(d)
    assert got[:20] == [(i, 1_000 + i, float(np.float32(1.0 / i))) for i in range(1, 21)]  # wall times kept
    assert len(got) == 21 and got[20][0] == 21 and got[20][2] == 0.5
    assert notes == [{"event": "notice", "text": f"training curves: visualdl --logdir {d}"}]


def test_loss_scale_only_when_the_scaler_is_on(tmp_path):
    d = tmp_path / "vdl"
    s = vdl.open_run(d, None, lambda ev: None)
    s.epoch(19, {"val_loss": 0.5, "val_acc": 0.75, "loss_scale": ""})
    s.epoch(38, {"val_loss": 0.25, "val_acc": 0.875, "loss_scale": 32768.0})
    s.close()
    recs = _records(tmp_path)
    assert _curve(recs, "val/loss") == {19: 0.5, 38: 0.25} and _curve(recs, "val/acc") == {19: 0.75, 38: 0.875}
    assert _curve(recs, "amp/loss_scale") == {38: 32768.0}
