"""pipeline/data.py: ImageFolder (with its memory-mapped cache), .npz, module:factory, digits, prepare."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline import data
from pipeline.config import DataConfig
from pipeline.errors import InputError
from tests.conftest import arrays


def _value(c: int, i: int, split: int = 0) -> int:
    """Each test image is one flat grey level that encodes (split, class, index): unique for c < 3, i < 8."""
    return 10 + split * 80 + c * 25 + i * 3


def _png(path: Path, value: int, size: int = 12, mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (size, size), (value,) * len(mode) if mode != "L" else value).save(path)
    return path


def _folder(root: Path, classes=("cat", "dog", "emu"), n: int = 6, size: int = 12, split: int = 0) -> Path:
    for c, name in enumerate(classes):
        for i in range(n):
            _png(root / name / f"{i:02d}.png", _value(c, i, split), size)
    return root


def _cfg(tmp_path: Path, root: Path, **kw) -> DataConfig:
    return DataConfig(source=str(root), cache_dir=str(tmp_path / "cache"), **kw)


def _cache_files(tmp_path: Path) -> list[str]:
    cache = tmp_path / "cache"
    return sorted(p.name for p in cache.iterdir()) if cache.is_dir() else []


def _error(cfg: DataConfig) -> str:
    with pytest.raises(InputError) as info:
        data.load(cfg)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    return str(info.value)


# ------------------------------------------------------------------ ImageFolder


def test_image_folder_shapes_labels_and_splits(tmp_path):
    root = _folder(tmp_path / "imgs")
    ds = data.load(_cfg(tmp_path, root))
    assert ds.labels == ("cat", "dog", "emu")
    assert ds.input_shapes["x"] == (3, 12, 12)
    assert ds.train.inputs["x"].shape == (18, 3, 12, 12) and ds.train.inputs["x"].dtype == np.uint8
    # 6 per class: round(0.9) = 1 val, 1 test, 4 train, stratified.
    assert (len(ds.train), len(ds.val), len(ds.test)) == (12, 3, 3)
    for split, per_class in ((ds.train, 4), (ds.val, 1), (ds.test, 1)):
        x, y = arrays(split)
        assert np.bincount(y, minlength=3).tolist() == [per_class] * 3
        for xi, yi in zip(x, y):  # every pixel of a sample is its file's grey level, which encodes the class
            assert (xi == xi.flat[0]).all()
            assert (int(xi.flat[0]) - 10) // 25 == yi
    all_idx = np.concatenate([ds.train.idx, ds.val.idx, ds.test.idx])
    assert sorted(all_idx.tolist()) == list(range(18))
    iface = ds.interface()
    assert iface["inputs"][0]["shape"] == [-1, 3, 12, 12]
    assert iface["outputs"][0]["shape"] == [-1, 3]
    assert iface["labels"] == ["cat", "dog", "emu"]


def test_image_folder_resize_and_grayscale(tmp_path):
    root = _folder(tmp_path / "imgs")
    ds = data.load(_cfg(tmp_path, root, image_size=8, channels=1))
    assert ds.input_shapes["x"] == (1, 8, 8)
    x, y = arrays(ds.train)
    assert x.shape == (12, 1, 8, 8)
    assert len(ds.preprocessing["mean"]) == 1 and len(ds.preprocessing["std"]) == 1


def test_image_folder_mixed_sizes_with_image_size(tmp_path):
    root = _folder(tmp_path / "imgs")
    _png(root / "dog" / "99.png", 40, size=20)
    ds = data.load(_cfg(tmp_path, root, image_size=10))
    assert ds.input_shapes["x"] == (3, 10, 10)
    assert len(ds.train) + len(ds.val) + len(ds.test) == 19


def test_image_folder_cache_is_built_once_and_memory_mapped(tmp_path):
    root = _folder(tmp_path / "imgs")
    cfg = _cfg(tmp_path, root)
    first = data.load(cfg)
    files = _cache_files(tmp_path)
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".npy")
    npy = tmp_path / "cache" / files[1]
    before = os.stat(npy)
    second = data.load(cfg)
    after = os.stat(npy)
    assert isinstance(second.train.inputs["x"], np.memmap) and not second.train.inputs["x"].flags.writeable
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rebuilt
    assert _cache_files(tmp_path) == files
    np.testing.assert_array_equal(np.asarray(first.train.inputs["x"]), np.asarray(second.train.inputs["x"]))
    np.testing.assert_array_equal(first.train.idx, second.train.idx)
    assert first.preprocessing == second.preprocessing


def test_image_folder_cache_key_follows_content_and_preprocessing(tmp_path):
    root = _folder(tmp_path / "imgs")
    data.load(_cfg(tmp_path, root))
    one = set(_cache_files(tmp_path))
    # Same name, same size, other pixels: a new cache, and the new pixels are what loads.
    _png(root / "cat" / "00.png", 201)
    ds = data.load(_cfg(tmp_path, root))
    two = set(_cache_files(tmp_path))
    assert len(two - one) == 2
    assert 201 in np.unique(np.asarray(ds.train.inputs["x"])).tolist() + np.unique(np.asarray(ds.val.inputs["x"])).tolist()
    # Other preprocessing: another cache too.
    data.load(_cfg(tmp_path, root, image_size=6))
    assert len(set(_cache_files(tmp_path)) - two) == 2


def test_image_folder_cache_build_leaves_no_temporary_files(tmp_path):
    root = _folder(tmp_path / "imgs")
    data.load(_cfg(tmp_path, root))
    assert not [n for n in _cache_files(tmp_path) if ".tmp-" in n]


def test_image_folder_train_val_test_layout(tmp_path):
    root = tmp_path / "imgs"
    _folder(root / "train", classes=("a", "b"), n=5, split=0)
    _folder(root / "val", classes=("a", "b"), n=2, split=1)
    _folder(root / "test", classes=("a", "b"), n=3, split=2)
    ds = data.load(_cfg(tmp_path, root))
    assert ds.labels == ("a", "b")
    assert (len(ds.train), len(ds.val), len(ds.test)) == (10, 4, 6)
    for k, split in enumerate((ds.train, ds.val, ds.test)):
        x, y = arrays(split)
        # Each sample's grey level says which folder it came from: the layout decides the split.
        assert all(10 + 80 * k <= int(v) < 10 + 80 * (k + 1) for v in x[:, 0, 0, 0])
        assert np.bincount(y).tolist() == [len(y) // 2] * 2


def test_image_folder_train_test_layout_carves_val_from_train(tmp_path):
    root = tmp_path / "imgs"
    _folder(root / "train", classes=("a", "b"), n=10, split=0)
    _folder(root / "test", classes=("a", "b"), n=3, split=2)
    ds = data.load(_cfg(tmp_path, root, val_fraction=0.2))
    assert (len(ds.train), len(ds.val), len(ds.test)) == (16, 4, 6)
    xv, _ = arrays(ds.val)
    assert all(int(v) < 90 for v in xv[:, 0, 0, 0])  # val came out of train/, not test/
    xt, _ = arrays(ds.test)
    assert all(int(v) >= 170 for v in xt[:, 0, 0, 0])


@pytest.mark.parametrize("splits, stray", [(True, "train.json"), (True, "train/_annotations.coco.json"),
                                           (False, "train.json")])
def test_class_folders_with_a_json_beside_them_stay_class_folders(tmp_path, splits, stray):
    """Classification (and a stage that does not name its task) reads class folders as it always did, whatever
    other json lies where a COCO layout keeps its annotations; only a detection task reads it as COCO, and says
    what is wrong with it as COCO."""
    root = tmp_path / "imgs"
    if splits:
        for k, name in enumerate(("train", "val", "test")):
            _folder(root / name, classes=("a", "b"), n=3, split=k)
    else:
        _folder(root, classes=("a", "b"), n=5)
    want = data.load(_cfg(tmp_path, root))
    (root / stray).write_text('{"classes": ["a", "b"]}')
    for targets in (None, "labels"):
        ds = data.load(_cfg(tmp_path, root), targets)
        assert ds.targets == "labels" and ds.labels == ("a", "b")
        for a, b in ((want.train, ds.train), (want.val, ds.val), (want.test, ds.test)):
            assert np.array_equal(a.idx, b.idx) and np.array_equal(arrays(a)[0], arrays(b)[0])
    with pytest.raises(InputError) as e:
        data.load(_cfg(tmp_path, root), "boxes")
    assert str(e.value) in (f'data.source {root / stray}: missing "images" (a COCO file has images, annotations and '
                            'categories)', f"data.source {root / 'train'}: no such folder (the images of train.json)")


def test_image_folder_split_class_missing_from_train(tmp_path):
    root = tmp_path / "imgs"
    _folder(root / "train", classes=("a", "b"), n=3)
    _folder(root / "test", classes=("a", "b", "zebra"), n=2)
    assert _error(_cfg(tmp_path, root)) == f"--data {root / 'test' / 'zebra'}: class not in {root / 'train'}"


def test_image_folder_empty_class_folder(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    (root / "c").mkdir()
    (root / "c" / "readme.txt").write_text("no images here")
    assert _error(_cfg(tmp_path, root)) == f"--data {root / 'c'}: class folder has no PNG/JPEG images"


def test_image_folder_only_one_class(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a",))
    assert _error(_cfg(tmp_path, root)) == f"--data {root}: found 1 class folder(s), need at least 2"


def test_image_folder_no_class_folders(tmp_path):
    root = tmp_path / "imgs"
    _png(root / "loose.png", 3)
    assert _error(_cfg(tmp_path, root)) == \
        f"--data {root}: no class folders (expected one sub-folder per class)"


def test_image_folder_size_mismatch_without_image_size(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    odd = _png(root / "b" / "03.png", 50, size=10)
    assert _error(_cfg(tmp_path, root)) == \
        f"--data {odd}: image is 10x10, others are 12x12 (set data.image_size to resize)"
    assert _cache_files(tmp_path) == []  # the half-built cache is gone


def test_image_folder_corrupt_image(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    bad = root / "a" / "02.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n this is not really a png")
    assert _error(_cfg(tmp_path, root)) == f"--data {bad}: not a readable PNG/JPEG image"
    assert _cache_files(tmp_path) == []


def test_image_folder_truncated_image(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    bad = root / "b" / "01.png"
    bad.write_bytes(bad.read_bytes()[:40])
    assert _error(_cfg(tmp_path, root)) == f"--data {bad}: not a readable PNG/JPEG image"


def test_image_folder_16_bit_png_is_refused(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    bad = root / "b" / "04.png"
    Image.fromarray(np.full((12, 12), 40000, np.uint16)).save(bad)
    with Image.open(bad) as im:
        mode = im.mode
    assert mode.startswith("I")
    assert _error(_cfg(tmp_path, root)) == f"--data {bad}: unsupported image mode {mode} (need grayscale or RGB)"


def test_image_folder_cmyk_jpeg_is_refused(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    bad = root / "a" / "05.jpg"
    Image.new("CMYK", (12, 12), (0, 50, 100, 0)).save(bad)
    assert _error(_cfg(tmp_path, root)) == f"--data {bad}: unsupported image mode CMYK (need grayscale or RGB)"


def test_image_folder_grayscale_and_palette_inputs_become_rgb(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    _png(root / "a" / "06.png", 77, mode="L")
    Image.new("RGB", (12, 12), (9, 9, 9)).convert("P").save(root / "b" / "06.png")
    ds = data.load(_cfg(tmp_path, root))
    assert ds.input_shapes["x"] == (3, 12, 12)
    assert len(ds.train) + len(ds.val) + len(ds.test) == 14


def test_missing_data_dir(tmp_path):
    missing = tmp_path / "nope"
    assert _error(_cfg(tmp_path, missing)) == f"--data {missing}: no such file or directory"


def test_unsupported_source_file(tmp_path):
    f = _png(tmp_path / "one.png", 5)
    assert _error(_cfg(tmp_path, f)) == \
        f"--data {f}: expected 'digits', 'shapes', an ImageFolder or COCO directory, an .npz file or module:factory"


def test_channels_other_than_1_or_3(tmp_path):
    root = _folder(tmp_path / "imgs", classes=("a", "b"))
    assert _error(_cfg(tmp_path, root, channels=4)) == "data.channels: must be 1 or 3, got 4"


# ------------------------------------------------------------------ npz


def _npz(tmp_path: Path, name: str = "d.npz", **arrays) -> Path:
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def _xy(n: int = 40, classes: int = 2, shape=(1, 4, 4), dtype=np.uint8):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(n, *shape)).astype(dtype)
    y = np.arange(n) % classes
    return x, y


def test_npz_loads_x_and_y_with_a_stratified_split(tmp_path):
    x, y = _xy()
    ds = data.load(DataConfig(source=str(_npz(tmp_path, x=x, y=y))))
    assert ds.input_shapes["x"] == (1, 4, 4) and ds.labels == ("0", "1")
    # 20 per class: 3 val, 3 test, 14 train each.
    assert (len(ds.train), len(ds.val), len(ds.test)) == (28, 6, 6)
    xt, yt = arrays(ds.train)
    np.testing.assert_array_equal(xt, x[ds.train.idx])
    np.testing.assert_array_equal(yt, y[ds.train.idx])
    assert yt.dtype == np.int64


def test_npz_split_is_seeded(tmp_path):
    x, y = _xy()
    path = _npz(tmp_path, x=x, y=y)
    a = data.load(DataConfig(source=str(path), split_seed=1))
    b = data.load(DataConfig(source=str(path), split_seed=1))
    c = data.load(DataConfig(source=str(path), split_seed=2))
    np.testing.assert_array_equal(a.val.idx, b.val.idx)
    assert not np.array_equal(a.val.idx, c.val.idx)


def test_npz_explicit_split_and_labels(tmp_path):
    x, y = _xy(n=12, classes=3)
    split = np.array([0] * 6 + [1] * 3 + [2] * 3)
    ds = data.load(DataConfig(source=str(_npz(tmp_path, x=x, y=y, split=split, labels=np.array(["r", "g", "b"])))))
    assert ds.labels == ("r", "g", "b")
    assert ds.train.idx.tolist() == list(range(6))
    assert ds.val.idx.tolist() == [6, 7, 8] and ds.test.idx.tolist() == [9, 10, 11]


def test_npz_nhw_becomes_nchw(tmp_path):
    x, y = _xy(shape=(5, 6))
    ds = data.load(DataConfig(source=str(_npz(tmp_path, x=x, y=y))))
    assert ds.input_shapes["x"] == (1, 5, 6)
    np.testing.assert_array_equal(ds.train.inputs["x"][:, 0], x)


def test_npz_float32_is_not_rescaled(tmp_path):
    x, y = _xy(dtype=np.float32)
    x = (x / 255.0).astype(np.float32)
    ds = data.load(DataConfig(source=str(_npz(tmp_path, x=x, y=y))))
    assert ds.preprocessing["scale"] == 1.0
    np.testing.assert_array_equal(ds.train.inputs["x"], x)


def test_npz_missing_key(tmp_path):
    x, _ = _xy()
    path = _npz(tmp_path, x=x)
    assert _error(DataConfig(source=str(path))) == f"{path}: needs arrays 'x' and 'y' (has x)"


def test_npz_wrong_x_dtype(tmp_path):
    x, y = _xy()
    path = _npz(tmp_path, x=x.astype(np.float64), y=y)
    assert _error(DataConfig(source=str(path))) == f"{path}: x must be uint8 or float32, got float64"


def test_npz_wrong_y_dtype(tmp_path):
    x, y = _xy()
    path = _npz(tmp_path, x=x, y=y.astype(np.float32))
    assert _error(DataConfig(source=str(path))) == f"{path}: y must be N integer labels matching x, got float32 (40,)"


def test_npz_wrong_rank(tmp_path):
    path = _npz(tmp_path, x=np.zeros((4, 16), np.uint8), y=np.zeros(4, np.int64))
    assert _error(DataConfig(source=str(path))) == f"{path}: x must have shape (N, C, H, W) or (N, H, W), got (4, 16)"


def test_npz_negative_label(tmp_path):
    x, y = _xy()
    y[3] = -1
    path = _npz(tmp_path, x=x, y=y)
    assert _error(DataConfig(source=str(path))) == f"{path}: labels must be >= 0"


def test_npz_label_beyond_the_label_names(tmp_path):
    x, y = _xy(n=30, classes=3)
    path = _npz(tmp_path, x=x, y=y, labels=np.array(["a", "b"]))
    assert _error(DataConfig(source=str(path))) == f"{path}: 2 labels but class ids go up to 2"


def test_npz_label_ids_without_names_cover_gaps(tmp_path):
    x, y = _xy(n=40, classes=2)
    y = y * 3  # ids 0 and 3: classes 1 and 2 have no samples but the head still has 4 outputs
    ds = data.load(DataConfig(source=str(_npz(tmp_path, x=x, y=y))))
    assert ds.labels == ("0", "1", "2", "3")


def test_npz_nan_in_float_x(tmp_path):
    x, y = _xy(dtype=np.float32)
    x[0, 0, 0, 0] = np.nan
    path = _npz(tmp_path, x=x, y=y)
    assert _error(DataConfig(source=str(path))) == f"{path}: x holds NaN or Inf"


def test_npz_empty(tmp_path):
    path = _npz(tmp_path, x=np.zeros((0, 1, 4, 4), np.uint8), y=np.zeros(0, np.int64))
    assert _error(DataConfig(source=str(path))) == f"{path}: no samples"


def test_npz_with_an_object_array_is_not_unpickled(tmp_path):
    path = _npz(tmp_path, x=np.array([{"a": 1}], dtype=object), y=np.zeros(1, np.int64))
    assert _error(DataConfig(source=str(path))) == f"{path}: not a readable .npz (ValueError)"


def test_npz_not_a_zip(tmp_path):
    path = tmp_path / "junk.npz"
    path.write_bytes(b"nope")
    assert _error(DataConfig(source=str(path))).startswith(f"{path}: not a readable .npz")


def test_npz_bad_split_length(tmp_path):
    x, y = _xy()
    path = _npz(tmp_path, x=x, y=y, split=np.zeros(3, np.uint8))
    assert _error(DataConfig(source=str(path))) == (
        f"{path}: split must have one entry per sample, each 0 (train), 1 (val) or 2 (test)")


def test_npz_split_value_out_of_range(tmp_path):
    x, y = _xy()
    split = np.zeros(len(y), np.uint8)
    split[0] = 7
    path = _npz(tmp_path, x=x, y=y, split=split)
    assert "each 0 (train), 1 (val) or 2 (test)" in _error(DataConfig(source=str(path)))


def test_npz_empty_split(tmp_path):
    x, y = _xy(n=6)
    path = _npz(tmp_path, x=x, y=y, split=np.array([0, 0, 0, 0, 2, 2]))
    assert _error(DataConfig(source=str(path))) == f"{path}: the val split is empty"


def test_npz_missing_file(tmp_path):
    path = tmp_path / "gone.npz"
    assert _error(DataConfig(source=str(path))) == f"--data {path}: no such file"


# ------------------------------------------------------------------ module:factory


def _module(tmp_path: Path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_factory_source(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "pipe_test_factory_ok", """
        import numpy as np
        def load(cfg):
            x = np.arange(9 * 16, dtype=np.float32).reshape(9, 4, 4) / 100
            y = np.array([0, 1, 2] * 3)
            return {"train": (x, y), "val": (x[:3], y[:3]), "test": (x[3:6], y[3:6]), "labels": ["a", "b", "c"]}
    """)
    ds = data.load(DataConfig(source=f"{mod}:load"))
    assert (len(ds.train), len(ds.val), len(ds.test)) == (9, 3, 3)
    assert ds.input_shapes["x"] == (1, 4, 4) and ds.labels == ("a", "b", "c")


def test_factory_errors(tmp_path, monkeypatch):
    mod = _module(tmp_path, monkeypatch, "pipe_test_factory_bad", """
        import numpy as np
        x = np.zeros((6, 1, 4, 4), np.uint8)
        y = np.array([0, 1, 2, 0, 1, 2])
        def few_labels(cfg):
            return {"train": (x, y), "val": (x, y), "test": (x, y), "labels": ["a", "b"]}
        def not_a_dict(cfg):
            return [x, y]
        def mixed_shapes(cfg):
            return {"train": (x, y), "val": (x[:, :, :2], y), "test": (x, y)}
    """)
    assert _error(DataConfig(source=f"{mod}:few_labels")) == f"--data {mod}:few_labels: 2 labels but class ids go up to 2"
    assert _error(DataConfig(source=f"{mod}:not_a_dict")) == \
        f"--data {mod}:not_a_dict: factory must return a dict with train, val and test (x, y) pairs"
    assert _error(DataConfig(source=f"{mod}:mixed_shapes")) == \
        f"--data {mod}:mixed_shapes: train/val/test must share sample shape and dtype"
    assert _error(DataConfig(source=f"{mod}:nope")).startswith(f"--data {mod}:nope: cannot import (")
    assert _error(DataConfig(source="no_such_module_xyz:load")) == \
        "--data no_such_module_xyz:load: cannot import (No module named 'no_such_module_xyz')"


# ------------------------------------------------------------------ digits and prepare


def test_digits_sizes_and_disjoint_splits():
    ds = data.load(DataConfig())
    assert ds.train.inputs["x"].shape == (1797, 1, 8, 8) and ds.train.inputs["x"].dtype == np.uint8
    assert (len(ds.train), len(ds.val), len(ds.test)) == (1259, 269, 269)
    assert ds.labels == tuple(str(i) for i in range(10))
    assert ds.input_shapes["x"] == (1, 8, 8)
    tr, va, te = (set(s.idx.tolist()) for s in (ds.train, ds.val, ds.test))
    assert not (tr & va) and not (tr & te) and not (va & te)
    assert tr | va | te == set(range(1797))
    for split in (ds.train, ds.val, ds.test):  # stratified: every class in every split
        assert set(arrays(split)[1].tolist()) == set(range(10))


def test_prepare_normalizes_with_the_recorded_mean_and_std():
    ds = data.load(DataConfig())
    pre = ds.preprocessing
    assert pre["kind"] == "image" and pre["layout"] == "NCHW" and pre["scale"] == pytest.approx(1 / 255)
    x, _ = arrays(ds.train)
    out = data.prepare(x, pre)
    assert out.dtype == np.float32 and out.shape == x.shape
    expected = (x.astype(np.float64) / 255.0 - pre["mean"][0]) / pre["std"][0]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    # The recorded stats are the training split's: normalized, it is zero-mean and unit-variance.
    assert abs(float(out.mean())) < 1e-4 and abs(float(out.std()) - 1.0) < 1e-4
    # Applied to val, the same stats are used (not re-estimated).
    xv, _ = arrays(ds.val)
    np.testing.assert_allclose(data.prepare(xv, pre), (xv / 255.0 - pre["mean"][0]) / pre["std"][0], rtol=1e-5, atol=1e-5)


def test_prepare_is_per_channel(tmp_path):
    x = np.zeros((10, 3, 2, 2), np.uint8)
    x[:, 0], x[:, 1], x[:, 2] = 0, 51, 255
    pre = {"kind": "image", "layout": "NCHW", "scale": 1 / 255, "mean": [0.0, 0.1, 0.5], "std": [1.0, 0.5, 0.25]}
    out = data.prepare(x, pre)
    np.testing.assert_allclose(out[0, :, 0, 0], [0.0, 0.2, 2.0], rtol=1e-6)


def test_prepare_refuses_an_unknown_kind():
    with pytest.raises(InputError, match="preprocessing kind 'audio' is not supported"):
        data.prepare(np.zeros((1, 1, 2, 2), np.uint8), {"kind": "audio"})


def test_imagefolder_train_and_val_only_carves_test_from_train(tmp_path):
    root = tmp_path / "data"
    _folder(root / "train", n=10)
    _folder(root / "val", n=2, split=1)
    ds = data.load(_cfg(tmp_path, root))
    assert ds.labels == ("cat", "dog", "emu")  # not ("train", "val")
    assert len(ds.val) == 6 and len(ds.test) > 0 and len(ds.train) + len(ds.test) == 30
