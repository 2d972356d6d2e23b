"""ernie_tiny, the built-in two-input text model, through the data layer and `pipe train`/`pipe export`:
data.text_inputs=ernie makes input_ids and token_type_ids from the character ids, the interface records
both, and a model/data mismatch is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import data as data_mod, iospec
from pipeline.config import DataConfig
from tests.conftest import REPO, reviews

YAML = REPO / "examples" / "chinese_sentiment_ernie.yaml"
SMALL = ["--set", "data.max_len=32", "--set", "train.batch_size=16", "--set", "train.warmup_epochs=0"]


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    return reviews(tmp_path_factory.mktemp("ernie-data") / "reviews.jsonl")


def test_text_inputs_ernie_makes_both_inputs_from_the_ids(texts):
    ids = data_mod.load(DataConfig(source=str(texts), max_len=32))
    two = data_mod.load(DataConfig(source=str(texts), max_len=32, text_inputs="ernie"))
    assert ids.input_names == ("x",) and "text_inputs" not in ids.preprocessing  # the default is as before
    assert two.input_names == ("input_ids", "token_type_ids") and two.preprocessing["text_inputs"] == "ernie"
    pos = np.arange(10)
    feeds = two.test.feeds(pos, two.preprocessing)
    np.testing.assert_array_equal(feeds["input_ids"], ids.test.feeds(pos, ids.preprocessing)["x"])
    assert feeds["token_type_ids"].dtype == np.int64 and not feeds["token_type_ids"].any()  # one segment
    desc = iospec.IO.from_interface(two.interface())
    assert [(t.name, t.dtype, t.shape) for t in desc.inputs] == [("input_ids", "int64", (-1, -1)),
                                                                 ("token_type_ids", "int64", (-1, -1))]


@pytest.mark.slow
def test_ernie_tiny_trains_and_exports_with_two_named_inputs(texts, tmp_path, cli):
    run = tmp_path / "run"
    code, _, err = cli("train", "--config", YAML, "--data", texts, "--run", run, "--epochs", "2", *SMALL)
    assert code == 0, err
    m = json.loads((run / "train" / "manifest.json").read_text())
    assert m["interface"]["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [-1, -1]},
                                        {"name": "token_type_ids", "dtype": "int64", "shape": [-1, -1]}]
    assert m["interface"]["outputs"] == [{"name": "logits", "dtype": "float32", "shape": [-1, 2]}]
    code, _, err = cli("export", run / "train", "--onnx")
    assert code == 0, err
    e = json.loads((run / "export" / "manifest.json").read_text())
    # every route kept both names (the legacy program included: einsum attention, erf GELU, softmax tanh)
    assert e["legacy"]["inputs"] == ["input_ids", "token_type_ids"]
    assert e["onnx"]["inputs"] == ["input_ids", "token_type_ids"]
    assert e["metrics"]["parity_rel"] <= 1e-4 and e["metrics"]["legacy_parity_rel"] <= 1e-4
    assert e["metrics"]["onnx_parity_rel"] <= 1e-4


def test_ernie_tiny_without_its_inputs_is_one_line(texts, tmp_path, cli):
    code, _, err = cli("train", "--config", YAML, "--data", texts, "--run", tmp_path / "run",
                       "--set", "data.text_inputs=ids", *SMALL)
    assert code == 2
    assert err.strip() == ("pipe train: error: --model ernie_tiny: takes inputs input_ids, token_type_ids, the data "
                           "gives x; set data.text_inputs=ernie")
    assert not (tmp_path / "run").exists()
