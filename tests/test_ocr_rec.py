"""The ocr_rec task's own pieces, without a model: CTC decode, RecMetric, the key file, the one pre-processing
and its width buckets, generated lines and PaddleOCR label files (pipeline/tasks/ocr_rec/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline import config as config_mod, pretrained, tasks
from pipeline.errors import InputError
from pipeline.tasks import ocr_rec
from pipeline.tasks.ocr_rec import data, lines, text

KEYS = ("a", "b", "中", "文")


def _probs(steps: list[int], classes: int = len(KEYS) + 2, p: float = 0.8) -> np.ndarray:
    out = np.full((1, len(steps), classes), (1 - p) / (classes - 1), np.float32)
    for t, c in enumerate(steps):
        out[0, t, c] = p
    return out


def test_ctc_greedy_merges_repeats_drops_blanks_and_maps_the_space_class():
    # blank=0, a=1, b=2, 中=3, 文=4, space=5
    (got,) = text.ctc_greedy(_probs([1, 1, 0, 1, 5, 3, 3, 0, 0, 4]), KEYS)
    assert got[0] == "aa 中文"
    assert got[1] == pytest.approx(0.8)
    (empty,) = text.ctc_greedy(_probs([0, 0, 0]), KEYS)
    assert empty == ("", 0.0)


def test_score_is_the_mean_of_the_kept_steps():
    probs = _probs([1, 0, 2])
    probs[0, 2, 2] = 0.5
    assert text.ctc_greedy(probs, KEYS)[0][1] == pytest.approx((0.8 + 0.5) / 2)


def test_metrics_as_recmetric():
    assert text.metrics(["中文 ", "ab"], ["中文", "ac"]) == {"acc": 0.5, "norm_edit_dis": pytest.approx(0.75)}
    assert text.metrics(["中文 "], ["中文"], ignore_space=False)["acc"] == 0.0
    assert text.metrics(["ＡＢ"], ["AB"], nfkc=True)["acc"] == 1.0
    assert text.metrics(["ＡＢ"], ["AB"])["acc"] == 0.0


def test_key_files(tmp_path):
    p = tmp_path / "keys.txt"
    p.write_bytes("a\r\nb\n中\n".encode())
    assert text.read_keys(p) == ("a", "b", "中")
    text.check_classes(("a", "b", "中"), 5, str(p))
    with pytest.raises(InputError, match=r"keys.txt: 3 keys \+ blank \+ space = 5 classes, the model's output has 6"):
        text.check_classes(("a", "b", "中"), 6, str(p))
    p.write_bytes(b"a\n\xff\n")
    with pytest.raises(InputError, match="not UTF-8"):
        text.read_keys(p)
    p.write_text("a\nbc\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2 holds 2 characters"):
        text.read_keys(p)
    p.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match="no characters"):
        text.read_keys(p)


def test_the_real_key_file_fits_pp_ocrv4():
    keys = text.read_keys(pretrained.ppocr() / pretrained.KEYS)
    assert len(keys) == 6623 and text.classes(keys) == 6625


def test_prepare_keeps_the_aspect_ratio_flips_to_bgr_and_normalises():
    img = np.zeros((24, 100, 3), np.uint8)
    img[..., 0] = 255  # red in RGB
    x = lines.prepare(img, max_width=3200)
    assert x.shape == (3, 48, 200) and x.dtype == np.float32
    assert np.allclose(x[2], 1.0) and np.allclose(x[0], -1.0)  # BGR: red is the last channel
    assert lines.prepare(np.zeros((10, 1000, 3), np.uint8), max_width=640).shape == (3, 48, 640)


def test_batches_are_bucketed_by_width_and_padded_with_zero():
    widths = [100, 900, 300, 700, 50]
    split = data.Lines([np.full((48, w, 3), 255, np.uint8) for w in widths], [str(w) for w in widths])
    info = tasks.Info(KEYS, dict(ocr_rec.settings))
    got = list(ocr_rec.batches(split, info, 2))
    assert [pos for pos, _ in got] == [[4, 0], [2, 3], [1]]  # in order of width
    assert [f["x"].shape[3] for _, f in got] == [320, 704, 960]  # at least 320, rounded up to 64
    _, feeds = got[1]
    assert np.all(feeds["x"][0, :, :, :300] == 1.0) and np.all(feeds["x"][0, :, :, 300:] == 0.0)
    assert [pos for pos, _ in ocr_rec.batches(split, info, 8, limit=3)] == [[0, 2, 1]]


def test_generated_lines_are_deterministic_and_in_the_keys():
    keys = text.read_keys(pretrained.ppocr() / pretrained.KEYS)
    a, b = data.generated((12, 3, 3), keys, seed=3), data.generated((12, 3, 3), keys, seed=3)
    assert a.train.texts == b.train.texts and all(np.array_equal(x, y) for x, y in zip(a.test.images, b.test.images))
    assert all(c in set(keys) for t in a.train.texts + a.val.texts + a.test.texts for c in t)
    assert all(i.dtype == np.uint8 and i.ndim == 3 and i.shape[2] == 3 for i in a.train.images)
    assert data.generated((12, 3, 3), keys, seed=4).train.texts != a.train.texts


def test_generated_lines_are_cached(tmp_path):
    keys = text.read_keys(pretrained.ppocr() / pretrained.KEYS)
    cfg = config_mod.load(None, ["data.source=ocr_lines", "data.ocr_lines=20", f"data.cache_dir={tmp_path}"]).data
    first = data.load(cfg, keys)
    (cached,) = list((tmp_path / "ocr_lines").glob("*.npz"))
    second = data.load(cfg, keys)
    assert second.val.texts == first.val.texts and len(first.train) == 20 and len(first.test) == 3
    assert all(np.array_equal(x, y) for x, y in zip(first.train.images, second.train.images))
    assert cached.is_file()


def _folder(root: Path, rows: dict[str, list[str]]) -> Path:
    from PIL import Image

    root.mkdir()
    for i in range(12):
        Image.new("RGB", (60 + i, 32), "white").save(root / f"{i}.png")
    for name, body in rows.items():
        (root / name).write_text("".join(r + "\n" for r in body), encoding="utf-8")
    return root


def test_label_files_with_and_without_val_and_test(tmp_path):
    full = _folder(tmp_path / "full", {"train.txt": [f"{i}.png\t文{i}" for i in range(8)],
                                        "val.txt": ["8.png\tab"], "test.txt": ["9.png\t中文", "10.png\ta b"]})
    cfg = config_mod.load(None, [f"data.source={full}"]).data
    d = data.load(cfg, KEYS)
    assert (len(d.train), len(d.val), len(d.test)) == (8, 1, 2)
    assert d.test.texts == ["中文", "a b"] and d.test.images[0].shape == (32, 69, 3)
    only = _folder(tmp_path / "only", {"rec_gt_train.txt": [f"{i}.png\tx{i}" for i in range(12)]})
    d = data.load(config_mod.load(None, [f"data.source={only}"]).data, KEYS)
    assert (len(d.train), len(d.val), len(d.test)) == (8, 2, 2)  # 15% of 12 each, rounded
    assert sorted(d.train.texts + d.val.texts + d.test.texts) == sorted(f"x{i}" for i in range(12))


@pytest.mark.parametrize("body, needle", [
    (["0.png\tok", "1.png no tab"], "train.txt:2: no tab"),
    (["0.png\tok", "missing.png\tx"], "train.txt:2: missing.png: missing or not a decodable image"),
    (["../outside.png\tx"], "train.txt:1: ../outside.png: outside the data folder"),
])
def test_bad_label_files_name_the_line(tmp_path, body, needle):
    root = _folder(tmp_path / "d", {"train.txt": body})
    with pytest.raises(InputError, match=needle.replace(".", r"\.")):
        data.load(config_mod.load(None, [f"data.source={root}"]).data, KEYS)


def test_a_data_source_that_is_no_folder(tmp_path):
    with pytest.raises(InputError, match=r"nope: no such file or folder \(ocr_rec takes ocr_lines, .* or PaddleOCR "
                                         r"label files: one label file, several comma-separated, or a folder of them"):
        data.load(config_mod.load(None, [f"data.source={tmp_path / 'nope'}"]).data, KEYS)


def test_check_outputs_and_answer():
    info = tasks.Info(KEYS, dict(ocr_rec.settings))
    probs = np.concatenate([_probs([1, 0, 2]), _probs([3, 3, 4])])
    assert ocr_rec.answer({"probs": probs}, info) == {"lines": [{"text": "ab", "score": pytest.approx(0.8)},
                                                                 {"text": "中文", "score": pytest.approx(0.8)}]}
    assert ocr_rec.fidelity({"probs": probs}, {"probs": probs[::-1].copy()}, info) == {"text_agreement": 0.0}
    ocr_rec.check_outputs({"probs": probs}, info, "here")
    with pytest.raises(InputError, match=r"here: ocr_rec needs one float \[N, T, 6\] output, got float32 \[2, 6\]"):
        ocr_rec.check_outputs({"probs": probs[:, 0]}, info, "here")
