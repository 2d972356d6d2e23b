"""`pipe all --config examples/chinese_sentiment.yaml` end to end on a small learnable Chinese review
file (the example's model and settings; only the data, length and epochs are shrunk for CI): every
stage, the vocabulary carried into the package, the report, the cache, and the package served with
`{"text": [...]}` answering like the packaged predictor."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import REPO, reviews
from tests.serving_helpers import start_server

pytestmark = pytest.mark.slow(reason="pipe all of a text model, served")
EXAMPLE = REPO / "examples/chinese_sentiment.yaml"


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> tuple[Path, list[str]]:
    from pipeline.cli import main

    root = tmp_path_factory.mktemp("all-text")
    data = reviews(root / "reviews.jsonl")
    args = ["all", "--config", str(EXAMPLE), "--run", str(root / "run"), "--set", f"data.source={data}",
            "--set", "data.max_len=24", "--set", "data.min_count=1", "--set", "train.epochs=4",
            "--set", "train.batch_size=32", "--set", "compress.calib_batches=4", "--set", "compress.latency_runs=20", "--set", "compress.throughput_runs=5"]
    assert main(args) == 0
    return root / "run", args


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def test_every_stage_and_the_vocabulary_travel(text_run):
    run, _ = text_run
    model = yaml.safe_load(EXAMPLE.read_text())["model"]["name"]
    assert _manifest(run / "train")["config"]["model"]["name"] == model
    vocab = (run / "train" / "vocab.json").read_bytes()
    for stage in ("export", "package"):
        assert (run / stage / "vocab.json").read_bytes() == vocab
    assert _manifest(run / "export")["interface"]["inputs"][0]["dtype"] == "int64"
    variants = _manifest(run / "compress")["metrics"]["variants"]
    assert {"fp32", "int8-onnx"} <= set(variants) and variants["int8-onnx"]["accuracy"] > 0.5
    md = (run / "report.md").read_text()
    assert "int8-onnx" in md and "vocab.json" in md  # the lineage lists the vocabulary's checksum


def test_second_run_is_cached(text_run, cli):
    run, args = text_run
    code, out, err = cli(*args)
    assert code == 0, err
    assert out.count(": cached (same config, input and versions; verified)") == 4


def test_the_package_serves_text(text_run):
    run, _ = text_run
    srv = start_server(run / "package")
    try:
        texts = ["好棒满意这个东西", "差烂失望这个东西"]
        r = httpx.post(srv.url + "/v1/predict", json={"text": texts}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["labels"] == ["pos", "neg"]
        assert httpx.post(srv.url + "/v1/predict", json={"text": [""]}, timeout=30).status_code == 422
    finally:
        assert srv.stop() == 0
