"""The text task: the built-in Chinese sentiment corpus, text files, the vocabulary, text models."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline import artifacts, data
from pipeline.config import DataConfig
from pipeline.errors import InputError
from tests.conftest import reviews


def test_chinese_sentiment_is_deduplicated_before_the_split():
    ds = data.load(DataConfig(source="chinese_sentiment"))
    pre = ds.preprocessing
    # 35,123 lines hold 17,410 distinct texts, 47 of them under both labels (dropped)
    assert pre["duplicates_removed"] == 35123 - 17410 and pre["dropped_conflicting"] == 47
    assert len(ds.texts) == 17410 - 47 == len(ds.train) + len(ds.val) + len(ds.test)
    splits = [{ds.texts[i] for i in s.idx} for s in (ds.train, ds.val, ds.test)]
    assert not (splits[0] & splits[1]) and not (splits[0] & splits[2]) and not (splits[1] & splits[2])
    assert ds.labels == ("negative", "positive")
    assert ds.train.inputs["x"].dtype == np.int64 and ds.train.inputs["x"].shape[1] == pre["max_len"] == 160
    iface = ds.interface()
    assert iface["inputs"] == [{"name": "x", "dtype": "int64", "shape": [-1, -1]}]
    assert iface["preprocessing"]["vocab_file"] == "vocab.json" and "vocab" not in iface["preprocessing"]


def test_vocabulary_comes_from_the_training_split_only(tmp_path):
    rows = ["text\tlabel"] + [f"好好好{i % 3}\tpos" for i in range(30)] + [f"坏坏坏{i % 3}\tneg" for i in range(30)]
    rows += ["独一无二的句子\tpos"]
    path = tmp_path / "d.tsv"
    path.write_text("\n".join(rows), encoding="utf-8")
    ds = data.load(DataConfig(source=str(path), min_count=1, max_len=6))
    vocab = ds.preprocessing["vocab"]
    assert vocab[:2] == ["[PAD]", "[UNK]"]
    train_chars = {c for i in ds.train.idx for c in ds.texts[i]}
    assert set(vocab[2:]) == train_chars
    # encoding: truncated to max_len, padded with 0, unknown -> 1
    ids = data.encode_texts(["好坏X好坏好坏好"], {c: i for i, c in enumerate(vocab)}, 6)
    assert ids.shape == (1, 6) and ids[0, 2] == 1 and (ids[0] > 0).all()
    assert data.encode_texts(["好"], {c: i for i, c in enumerate(vocab)}, 6)[0, 1:].tolist() == [0] * 5


@pytest.mark.parametrize("name,body,message", [
    ("a.tsv", "txt\tlabel\n好\tpos\n", "no column 'text'"),
    ("a.csv", "text,lab\n好,pos\n", "no column 'label'"),
    ("a.tsv", "text\tlabel\n\tpos\n好\tneg\n", "line 2: empty text"),
    ("a.jsonl", '{"text": "好", "label": "pos"}\n{"text": "坏"}\n', "line 2 has no 'label'"),
    ("a.jsonl", '{"text": "好", "label": "pos"}\nnot json\n', "line 2 is not JSON"),
    ("a.tsv", "text\tlabel\n好\tpos\n坏\tpos\n", "needs at least 2 labels"),
])
def test_text_file_errors_name_the_file_and_line(tmp_path, name, body, message):
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    with pytest.raises(InputError) as e:
        data.load(DataConfig(source=str(path)))
    assert str(e.value).startswith(f"--data {path}") and message in str(e.value)


def test_text_file_must_be_utf8(tmp_path):
    path = tmp_path / "gbk.tsv"
    path.write_bytes("text\tlabel\n很好\tpos\n".encode("gbk"))
    with pytest.raises(InputError, match="not UTF-8"):
        data.load(DataConfig(source=str(path)))



@pytest.mark.parametrize("model", ["text_cnn", "bigru", "transformer", "text_fasttext"])
def test_text_models_train_and_carry_the_vocabulary(tmp_path, cli, model):
    src = reviews(tmp_path / "reviews.jsonl")
    # 15 steps: a bag of embeddings needs a higher peak LR than 3e-3 to get anywhere that fast
    lr = ["--set", "train.lr=1e-2"] if model == "text_fasttext" else []
    code, _, err = cli("train", "--data", src, "--model", model, "--run", tmp_path / "run", "--epochs", "3",
                       "--batch-size", "32", "--set", "data.max_len=24", "--set", "data.min_count=1", *lr)
    assert code == 0, err
    art = artifacts.verify(tmp_path / "run" / "train", ("train",))
    assert {p.name for p in art.path.iterdir()} >= {"vocab.json", "model.safetensors", "manifest.json"}
    vocab = json.loads((art.path / "vocab.json").read_text(encoding="utf-8"))
    assert vocab[:2] == ["[PAD]", "[UNK]"] and art.manifest["interface"]["preprocessing"]["vocab_size"] == len(vocab)
    assert art.manifest["interface"]["inputs"][0]["dtype"] == "int64"
    assert art.manifest["metrics"]["test_acc"] >= 0.8, art.manifest["metrics"]


def test_text_model_on_image_data_is_refused(tmp_path, cli):
    code, _, err = cli("train", "--model", "text_cnn", "--run", tmp_path, "--epochs", "1")
    assert code == 2 and "--model text_cnn: not a model for image data" in err


@pytest.mark.slow
@pytest.mark.parametrize("model,legacy", [("text_cnn", True), ("bigru", False), ("text_fasttext", True),
                                          ("transformer", True)])
def test_text_export_takes_int64_ids_of_any_length(tmp_path, cli, model, legacy):
    src = reviews(tmp_path / "reviews.jsonl")
    run = tmp_path / "run"
    assert cli("train", "--data", src, "--model", model, "--run", run, "--epochs", "1", "--batch-size", "32",
               "--set", "data.max_len=24", "--set", "data.min_count=1")[0] == 0
    code, _, err = cli("export", run / "train")
    assert code == 0, err
    art = artifacts.verify(run / "export", ("export",))
    assert art.manifest["interface"]["inputs"][0] == {"name": "x", "dtype": "int64", "shape": [-1, -1]}
    assert art.manifest["metrics"]["parity_rel"] <= 1e-4
    assert (run / "export" / "vocab.json").read_bytes() == (run / "train" / "vocab.json").read_bytes()
    # nn.GRU cannot be written as a legacy program by Paddle 3.3.1: recorded, not fatal
    assert (run / "export" / "legacy").is_dir() == legacy
    assert art.manifest["legacy"].get("available", True) == legacy

    from pipeline import runtime

    paddle = runtime.import_paddle()
    config = paddle.inference.Config(str(run / "export/model.json"), str(run / "export/model.pdiparams"))
    pred = paddle.inference.create_predictor(config)
    for length in (5, 24):  # dynamic sequence length
        h = pred.get_input_handle("x")
        h.copy_from_cpu(np.full((2, length), 3, np.int64))
        pred.run()
        assert pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu().shape == (2, 2)


def _fasttext(vocab_size: int = 50):
    from pipeline import runtime
    from pipeline.nets import models

    paddle = runtime.import_paddle()
    paddle.seed(0)
    net = models.build("text_fasttext", 3, (24,), vocab_size)
    net.eval()
    return paddle, net


def test_fasttext_takes_any_length_and_ignores_trailing_padding():
    paddle, net = _fasttext()
    rng = np.random.RandomState(0)
    for length in (1, 2, 7, 40):  # 1: no bigram at all; 40: longer than the max_len it was built for
        x = rng.randint(1, 50, (4, length)).astype(np.int64)
        x[1, length // 2 + 1:] = 0  # a shorter text in the same batch
        out = net(paddle.to_tensor(x)).numpy()
        assert out.shape == (4, 3) and np.isfinite(out).all()
        padded = np.concatenate([x, np.zeros((4, 9), np.int64)], axis=1)
        np.testing.assert_allclose(net(paddle.to_tensor(padded)).numpy(), out, rtol=0, atol=1e-5)


def test_fasttext_bigram_hashing_is_exact_in_int64():
    """Bigram ids are computed in the graph; ids from a vocabulary of 1e6 must not overflow or round."""
    from pipeline.nets import models

    paddle, _ = _fasttext()
    x = np.array([[999_999, 999_998, 5, 0, 0], [1, 2, 3, 4, 0]], np.int64)
    got = models._hashed_ngrams(paddle.to_tensor(x), 2, 20011).numpy()
    want = np.zeros_like(x)
    for i, row in enumerate(x.tolist()):
        for j in range(len(row) - 1):
            if row[j] and row[j + 1]:
                want[i, j] = (row[j] * 1000003 + row[j + 1]) % 20011 + 1
    assert (got == want).all()


@pytest.mark.slow
def test_fasttext_export_onnx_parity(tmp_path, cli):
    """The hashing's int64 arithmetic survives paddle2onnx (scalar constants once went through float32)."""
    src = reviews(tmp_path / "reviews.jsonl")
    run = tmp_path / "run"
    assert cli("train", "--data", src, "--model", "text_fasttext", "--run", run, "--epochs", "1",
               "--batch-size", "32", "--set", "data.max_len=24", "--set", "data.min_count=1")[0] == 0
    code, _, err = cli("export", run / "train", "--onnx")
    assert code == 0, err
    m = artifacts.verify(run / "export", ("export",)).manifest["metrics"]
    assert m["parity_rel"] <= 1e-4 and m["legacy_parity_rel"] <= 1e-4 and m["onnx_parity_rel"] <= 1e-4
