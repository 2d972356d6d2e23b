"""Several named inputs in the data layer: a factory's mapping of inputs, an .npz with `x.<name>` keys, each
input's preprocessing, `feeds`, the interface; malformed sources refused in one line. And how models are
called and their outputs named (pipeline/nets/models.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from pipeline import data, iospec
from pipeline.config import DataConfig
from pipeline.errors import InputError
from pipeline.nets import models
from tests.conftest import arrays


def _error(cfg: DataConfig) -> str:
    with pytest.raises(InputError) as e:
        data.load(cfg)
    return str(e.value)


def _arrays(n: int = 40, classes: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, size=(n, 1, 4, 4)).astype(np.uint8)
    feat = rng.normal(size=(n, 3)).astype(np.float32)
    ids = rng.integers(0, 9, size=(n, 5)).astype(np.int64)
    return img, feat, ids, np.arange(n) % classes


def _npz(tmp_path: Path, **arrays: np.ndarray) -> str:
    path = tmp_path / "d.npz"
    np.savez(path, **arrays)
    return str(path)


def test_npz_with_named_inputs(tmp_path):
    img, feat, ids, y = _arrays()
    ds = data.load(DataConfig(source=_npz(tmp_path, **{"x.img": img, "x.feat": feat, "x.ids": ids}, y=y)))
    assert ds.input_names == ("img", "feat", "ids")  # the file's order
    assert ds.input_shapes == {"img": (1, 4, 4), "feat": (3,), "ids": (5,)}
    assert (len(ds.train), len(ds.val), len(ds.test)) == (28, 6, 6)  # the same stratified split as x
    pre = ds.preprocessing
    assert pre["kind"] == "inputs" and pre["inputs"]["feat"] == {"kind": "none"} == pre["inputs"]["ids"]
    assert pre["inputs"]["img"]["kind"] == "image" and pre["inputs"]["img"]["scale"] == 1 / 255
    pos = np.array([3, 0, 5])
    feeds = ds.val.feeds(pos, pre)
    j = ds.val.idx[pos]
    assert list(feeds) == ["img", "feat", "ids"]
    np.testing.assert_array_equal(feeds["feat"], feat[j])
    np.testing.assert_array_equal(feeds["ids"], ids[j])
    assert feeds["ids"].dtype == np.int64
    np.testing.assert_allclose(feeds["img"], data.prepare(img[j], pre["inputs"]["img"]))
    assert feeds["img"].dtype == np.float32
    iface = ds.interface()
    assert iface["inputs"] == [{"name": "img", "dtype": "float32", "shape": [-1, 1, 4, 4]},
                               {"name": "feat", "dtype": "float32", "shape": [-1, 3]},
                               {"name": "ids", "dtype": "int64", "shape": [-1, 5]}]
    io = iospec.IO.from_interface(iface)
    io.feeds(feeds, "test")  # the interface accepts what the data feeds


def test_single_input_data_is_as_before(tmp_path):
    img, _, _, y = _arrays()
    ds = data.load(DataConfig(source=_npz(tmp_path, x=img, y=y)))
    assert ds.input_names == ("x",) and ds.preprocessing["kind"] == "image"
    assert ds.interface() == {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 1, 4, 4]}],
                              "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, 2]}],
                              "labels": ["0", "1"], "preprocessing": ds.preprocessing}
    pos = np.arange(len(ds.test))
    (x,) = ds.test.feeds(pos, ds.preprocessing).values()
    np.testing.assert_array_equal(x, data.prepare(arrays(ds.test)[0], ds.preprocessing))
    named = data.load(DataConfig(source=_npz(tmp_path, **{"x.x": img}, y=y)))  # one named input: the same
    assert named.preprocessing == ds.preprocessing and named.interface() == ds.interface()


@pytest.mark.parametrize("arrays,message", [
    ({"x": "img", "x.feat": "feat", "y": "y"},
     "has both 'x' and 'x.feat'; give one input as 'x' or every input as 'x.<name>'"),
    ({"x.img": "img", "x.feat": "feat"}, "needs array 'y' beside x.img, x.feat (has x.img, x.feat)"),
    ({"x.1a": "img", "y": "y"}, "input name '1a' must be an identifier (letters, digits, _; not starting with a digit)"),
    ({"x.": "img", "y": "y"}, "input name '' must be an identifier (letters, digits, _; not starting with a digit)"),
    ({"x.img": "img", "x.feat": "short", "y": "y"},
     "inputs 'img' and 'feat' have 40 and 39 samples; every input needs one entry per sample"),
    ({"x.img": "img", "x.feat": "f64", "y": "y"},
     "input 'feat' is float64 (40, 3); an input is float32, int64, int32 or bool with a leading sample axis, or "
     "a uint8 (N, C, H, W) image"),
    ({"x.img": "img", "x.feat": "u8", "y": "y"},
     "input 'feat' is uint8 (40, 3); an input is float32, int64, int32 or bool with a leading sample axis, or "
     "a uint8 (N, C, H, W) image"),
    ({"x.img": "img", "x.feat": "nan", "y": "y"}, "input 'feat' holds NaN or Inf"),
    ({"x.img": "img", "y": "short_y"}, "y must be N integer labels matching the inputs' 40 samples, got int64 (39,)"),
])
def test_npz_named_inputs_refused_in_one_line(tmp_path, arrays, message):
    img, feat, _, y = _arrays()
    nan = feat.copy()
    nan[0, 0] = np.inf
    pool = {"img": img, "feat": feat, "y": y, "short": feat[:-1], "f64": feat.astype(np.float64),
            "u8": feat.astype(np.uint8), "nan": nan, "short_y": y[:-1]}
    path = _npz(tmp_path, **{k: pool[v] for k, v in arrays.items()})
    assert _error(DataConfig(source=path)) == f"{path}: {message}"


def _module(tmp_path: Path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_factory_with_named_inputs(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "pipe_test_named_factory", """
        import numpy as np
        rng = np.random.default_rng(0)
        def part(n):
            return ({"tokens": rng.integers(0, 5, (n, 6)).astype(np.int64),
                     "mask": np.ones((n, 6), bool)}, np.arange(n) % 3)
        def load(cfg):
            return {"train": part(12), "val": part(6), "test": part(6), "labels": ["a", "b", "c"]}
        def mixed(cfg):
            out = load(cfg)
            out["val"] = (out["val"][0]["tokens"].reshape(6, 1, 2, 3).astype(np.uint8), out["val"][1])
            return out
        def renamed(cfg):
            out = load(cfg)
            out["test"] = ({"tokens": out["test"][0]["tokens"], "pad": out["test"][0]["mask"]}, out["test"][1])
            return out
        def not_pairs(cfg):
            return {"train": part(12)[0], "val": part(6), "test": part(6)}
    """)
    ds = data.load(DataConfig(source=f"{mod}:load"))
    assert (len(ds.train), len(ds.val), len(ds.test)) == (12, 6, 6)
    assert ds.preprocessing == {"kind": "inputs", "inputs": {"tokens": {"kind": "none"}, "mask": {"kind": "none"}}}
    assert [(t.name, t.dtype, t.shape) for t in ds.inputs()] == [("tokens", "int64", (-1, 6)), ("mask", "bool", (-1, 6))]
    feeds = ds.test.feeds(np.arange(2), ds.preprocessing)
    assert feeds["mask"].dtype == np.bool_ and feeds["tokens"].shape == (2, 6)
    assert _error(DataConfig(source=f"{mod}:mixed")) == (
        f"--data {mod}:mixed: train/val/test must all give x as an array or all as a mapping of inputs")
    assert _error(DataConfig(source=f"{mod}:renamed")) == (
        f"--data {mod}:renamed: train/val/test must share input names, sample shapes and dtypes")
    assert _error(DataConfig(source=f"{mod}:not_pairs")) == (
        f"--data {mod}:not_pairs: factory must return a dict with train, val and test (x, y) pairs")


def test_preprocessing_of_several_inputs_must_name_them():
    with pytest.raises(InputError, match="preprocessing describes inputs a, b, the data has a"):
        data.prepare_feeds({"a": np.zeros(2)}, {"kind": "inputs", "inputs": {"a": {"kind": "none"}, "b": {"kind": "none"}}})
    with pytest.raises(InputError, match="preprocessing of kind 'image' describes one input, the data has 2"):
        data.input_preprocessing({"kind": "image"}, ["a", "b"])


# ------------------------------------------------------------------ models: calling and outputs


def _layer(forward):
    import paddle

    return type("Net", (paddle.nn.Layer,), {"forward": forward})()


def test_calling_rule():
    def named(self, feat, img, extra=None):
        return img
    call = models.calling(_layer(named), ["img", "feat"], "m")
    assert call.keyword and call.spec_order == ("feat", "img")  # forward's order, for a jit.save input_spec
    assert call.split({"feat": 1, "img": 2}) == ((), {"img": 2, "feat": 1})

    def positional(self, a, b):
        return a
    call = models.calling(_layer(positional), ["img", "feat"], "m")
    assert not call.keyword and call.split({"feat": 1, "img": 2}) == ((2, 1), {})

    import paddle
    seq = paddle.nn.Sequential(paddle.nn.Flatten())  # forward(input): named after no input
    assert not models.calling(seq, ["x"], "m").keyword

    def kwargs_only(self, **feeds):
        return feeds
    assert models.calling(_layer(kwargs_only), ["a", "b"], "m").keyword

    def one(self, a):
        return a
    with pytest.raises(InputError, match=r"^m: forward\(a\) takes 1 positional inputs, the data gives 2 \(img, feat\)"):
        models.calling(_layer(one), ["img", "feat"], "m")


def test_outputs_are_named_as_export_will_see_them():
    import paddle

    t = paddle.zeros([2, 3])
    single = models.outputs(t, "", "m")
    assert single.names == ("logits",) and single.logits_of(t) is t
    d = models.outputs({"logits": t, "embedding": t * 2, "aux": t * 3}, "", "m")
    assert d.names == ("aux", "embedding", "logits") and d.logits == "logits"  # sorted: paddle.jit.save's order
    one = models.outputs((t,), "", "m")
    assert one.names == ("output_0",) and one.logits == "output_0"
    tup = models.outputs([t * 2, t], "output_1", "m")
    assert tup.names == ("output_0", "output_1") and tup.logits_of([t * 2, t]) is t
    assert list(tup.named((1, 2))) == ["output_0", "output_1"]
    with pytest.raises(InputError, match="^model.logits_output 'nope': the model's outputs are aux, embedding, logits$"):
        models.outputs({"logits": t, "embedding": t, "aux": t}, "nope", "m")
    with pytest.raises(InputError, match="output 'output_1' is a list, not a tensor"):
        models.outputs((t, [t]), "output_0", "m")
    with pytest.raises(InputError, match="output name 'a b' must be an identifier"):
        models.outputs({"a b": t}, "", "m")
