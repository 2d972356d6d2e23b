"""The `pipe` command line: bad input is one line on stderr and exit 2, nothing written; no paddle for --help."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, tree_hash
from pipeline import __version__


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ------------------------------------------------------------------ bad input before any training


def _missing_config(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--config", tmp / "nope.yaml", "--run", tmp / "run"], f"{tmp / 'nope.yaml'}: config file not found"


def _bad_yaml(tmp: Path) -> tuple[list[str], str]:
    (tmp / "bad.yaml").write_text("train:\n  lr: [0.1\n")
    return ["train", "--config", tmp / "bad.yaml", "--run", tmp / "run"], f"{tmp / 'bad.yaml'}: invalid YAML at line"


def _non_mapping_yaml(tmp: Path) -> tuple[list[str], str]:
    (tmp / "list.yaml").write_text("- train\n")
    return ["train", "--config", tmp / "list.yaml", "--run", tmp / "run"], f"{tmp / 'list.yaml'}: expected a mapping"


def _unknown_key_yaml(tmp: Path) -> tuple[list[str], str]:
    (tmp / "unk.yaml").write_text("train:\n  lrr: 0.1\n")
    return (["train", "--config", tmp / "unk.yaml", "--run", tmp / "run"],
            f"{tmp / 'unk.yaml'}: train.lrr: unknown key (did you mean train.lr?)")


def _unknown_key_set(tmp: Path) -> tuple[list[str], str]:
    return (["train", "--set", "train.lrr=3e-4", "--run", tmp / "run"],
            "--set train.lrr: unknown key (did you mean train.lr?)")


def _wrong_type_set(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--set", "train.epochs=2.5", "--run", tmp / "run"], "--set train.epochs: expected int, got float 2.5"


def _wrong_type_yaml(tmp: Path) -> tuple[list[str], str]:
    (tmp / "type.yaml").write_text("data:\n  persistent_workers: sometimes\n")
    return (["train", "--config", tmp / "type.yaml", "--run", tmp / "run"],
            f"{tmp / 'type.yaml'}: data.persistent_workers: expected bool, got str 'sometimes'")


def _wrong_type_flag(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--epochs", "two", "--run", tmp / "run"], "Invalid value for '--epochs'"


def _malformed_set(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--set", "train.lr", "--run", tmp / "run"], "--set train.lr: expected section.key=value"


def _unknown_flag(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--bogus", "--run", tmp / "run"], "No such option: --bogus"


def _unknown_command(tmp: Path) -> tuple[list[str], str]:
    return ["trian"], "No such command 'trian'"


def _nproc_zero(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--nproc", "0", "--run", tmp / "run"], "--nproc: must be >= 1, got 0"


def _bad_choice_flag(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--amp", "O7", "--run", tmp / "run"], "--amp: must be one of O0, O1, O2, got 'O7'"


def _unknown_model(tmp: Path) -> tuple[list[str], str]:
    return ["train", "--model", "resnet1800", "--epochs", "1", "--run", tmp / "run"], "--model resnet1800: unknown model"


def _unimportable_model(tmp: Path) -> tuple[list[str], str]:
    return (["train", "--model", "no_such_pkg_xyz.net:build", "--epochs", "1", "--run", tmp / "run"],
            "--model no_such_pkg_xyz.net:build: cannot import (No module named 'no_such_pkg_xyz')")


def _missing_data_dir(tmp: Path) -> tuple[list[str], str]:
    return (["train", "--data", tmp / "no-images", "--epochs", "1", "--run", tmp / "run"],
            f"--data {tmp / 'no-images'}: no such file or directory")


def _missing_export_input(tmp: Path) -> tuple[list[str], str]:
    return ["export"], "Missing argument"


CASES = {
    "missing config file": _missing_config,
    "bad YAML": _bad_yaml,
    "YAML not a mapping": _non_mapping_yaml,
    "unknown key in YAML": _unknown_key_yaml,
    "unknown key in --set": _unknown_key_set,
    "wrong type in --set": _wrong_type_set,
    "wrong type in YAML": _wrong_type_yaml,
    "wrong type for a flag": _wrong_type_flag,
    "--set without =": _malformed_set,
    "unknown flag": _unknown_flag,
    "unknown command": _unknown_command,
    "--nproc 0": _nproc_zero,
    "bad choice for a flag": _bad_choice_flag,
    "unknown model name": _unknown_model,
    "unimportable model factory": _unimportable_model,
    "missing data dir": _missing_data_dir,
    "export without input": _missing_export_input,
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, cli, tmp_path):
    args, expected = CASES[case](tmp_path)
    before = tree_hash(tmp_path)
    code, _, err = cli(*args)
    line = _one_line(err)
    assert code == 2, err
    assert line.startswith(f"pipe {args[0]}: error: " if case != "unknown command" else "pipe: error: "), line
    assert expected in line
    assert tree_hash(tmp_path) == before  # nothing written: no run dir, no logs
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ bad artifacts given to export


@pytest.fixture
def run_copy(trained_digits, tmp_path) -> Path:
    """A private copy of the shared trained run, free to tamper with."""
    return Path(shutil.copytree(trained_digits, tmp_path / "run", symlinks=True))


def _checkpoint(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "last").read_text().strip()


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


TAMPER = {
    "flipped byte": (lambda t: _flip(t / "model.safetensors"), "sha256 mismatch for model.safetensors"),
    "truncated": (lambda t: _truncate(t / "model.safetensors"), "size mismatch for model.safetensors"),
    "deleted": (lambda t: (t / "metrics.csv").unlink(), "missing file metrics.csv"),
    "added": (lambda t: (t / "extra.pdparams").write_bytes(b"\x80\x04K\x01."),
              "unexpected file extra.pdparams (not in the manifest)"),
    "manifest deleted": (lambda t: (t / "manifest.json").unlink(), "manifest.json: missing"),
    "manifest not JSON": (lambda t: (t / "manifest.json").write_text("{"), "manifest.json: not valid JSON"),
}


@pytest.mark.parametrize("kind", list(TAMPER), ids=list(TAMPER))
def test_export_refuses_a_tampered_train_artifact(kind, cli, run_copy):
    pytest.importorskip("stages.export")
    tamper, expected = TAMPER[kind]
    tamper(run_copy / "train")
    before = tree_hash(run_copy)
    code, _, err = cli("export", run_copy / "train")
    line = _one_line(err)
    assert code == 2, err
    assert line.startswith(f"pipe export: error: {run_copy / 'train' / 'manifest.json'}: "), line
    assert expected in line
    assert tree_hash(run_copy) == before
    assert not (run_copy / "export").exists()
    assert not [p for p in run_copy.iterdir() if ".tmp-" in p.name]


def test_export_refuses_a_checkpoint_dir(cli, run_copy):
    pytest.importorskip("stages.export")
    ckpt = _checkpoint(run_copy)
    before = tree_hash(run_copy)
    code, _, err = cli("export", ckpt)
    line = _one_line(err)
    assert code == 2
    assert line == f"pipe export: error: {ckpt / 'manifest.json'}: stage is 'checkpoint', expected train"
    assert tree_hash(run_copy) == before


def test_export_refuses_a_run_dir(cli, run_copy):
    pytest.importorskip("stages.export")
    before = tree_hash(run_copy)
    code, _, err = cli("export", run_copy)
    line = _one_line(err)
    assert code == 2
    assert line == (f"pipe export: error: {run_copy / 'manifest.json'}: "
                    "missing (not a pipe artifact, or an interrupted write)")
    assert tree_hash(run_copy) == before
    assert not (run_copy.parent / "export").exists()


def test_export_refuses_a_missing_dir(cli, tmp_path):
    pytest.importorskip("stages.export")
    code, _, err = cli("export", tmp_path / "nope" / "train")
    assert code == 2
    assert _one_line(err) == f"pipe export: error: {tmp_path / 'nope' / 'train'}: no such artifact directory"
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_a_wrong_stage_manifest(cli, run_copy):
    pytest.importorskip("stages.export")
    mpath = run_copy / "train" / "manifest.json"
    m = json.loads(mpath.read_text())
    m["stage"] = "package"
    mpath.write_text(json.dumps(m))
    code, _, err = cli("export", run_copy / "train")
    assert code == 2
    assert _one_line(err) == f"pipe export: error: {mpath}: stage is 'package', expected train"
    assert not (run_copy / "export").exists()


# ------------------------------------------------------------------ inspect


def test_inspect_verify_prints_the_stage(cli, trained_digits):
    before = tree_hash(trained_digits)
    code, out, err = cli("inspect", trained_digits / "train", "--verify")
    assert code == 0, err
    assert err == ""
    assert "train" in out and "verified" in out and "test_acc=" in out
    assert "input  x: float32 [-1, 1, 8, 8]" in out
    assert "labels 10: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9" in out
    assert tree_hash(trained_digits) == before


def test_inspect_verify_refuses_a_tampered_artifact(cli, run_copy):
    _flip(run_copy / "train" / "model.safetensors")
    code, _, err = cli("inspect", run_copy / "train", "--verify")
    assert code == 2
    assert _one_line(err) == (f"pipe inspect: error: {run_copy / 'train' / 'manifest.json'}: "
                              "sha256 mismatch for model.safetensors")


# ------------------------------------------------------------------ version, help, lazy paddle


def test_version(cli):
    code, out, err = cli("--version")
    assert code == 0 and err == ""
    assert out.strip() == f"pipe {__version__}"


def test_help(cli):
    code, out, err = cli("--help")
    assert code == 0 and err == ""
    for command in ("train", "export", "inspect", "all"):
        assert command in out


def test_no_arguments_shows_help(cli):
    code, out, _ = cli()
    assert code == 0
    assert "train" in out and "export" in out


def test_train_help_lists_the_flags(cli):
    code, out, _ = cli("train", "--help")
    assert code == 0
    for flag in ("--config", "--set", "--run", "--nproc", "--resume"):
        assert flag in out


def test_help_does_not_import_paddle():
    code = "import sys; from pipeline.cli import main; main(['--help']); print('paddle' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"


def test_config_errors_do_not_import_paddle():
    code = ("import sys; from pipeline.cli import main; rc = main(['train', '--set', 'train.lrr=1']); "
            "print(rc, 'paddle' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.stdout.strip().splitlines()[-1] == "2 False"
    assert _one_line(proc.stderr) == "pipe train: error: --set train.lrr: unknown key (did you mean train.lr?)"
