"""The README's chain with relative paths, as a user types it: children (legacy export, paddle2onnx,
PaddleSlim) run in other working directories and must get absolute paths."""

from __future__ import annotations

import pytest

from pipeline import artifacts
from tests.conftest import REPO


pytestmark = pytest.mark.slow(reason="runs the README's whole chain, compress and package included")


def test_readme_chain_with_relative_paths(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    steps = [
        ("train", "--config", REPO / "examples/digits.yaml", "--run", "runs/exp1", "--epochs", "1"),
        ("export", "runs/exp1/train"),  # no --onnx: package converts with paddle2onnx itself
        ("compress", "runs/exp1/export", "--int8", "--set", "compress.latency_runs=10",
         "--set", "compress.throughput_runs=3"),
        ("package", "runs/exp1/export"),
        ("inspect", "runs/exp1/package", "--verify"),
    ]
    for args in steps:
        code, _, err = cli(*args)
        assert code == 0, (args[0], err)
    chain = [a.stage for a, _ in artifacts.lineage(artifacts.verify(tmp_path / "runs/exp1/package", ("package",)))]
    assert chain == ["package", "export", "train"]
    assert (tmp_path / "runs/exp1/package/triton").is_dir()
