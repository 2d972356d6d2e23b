"""ocr_rec's second built-in source, `ocr_lines_dotmatrix` (pipeline/tasks/ocr_rec/data.py): short corpus lines
in dot-matrix print, the domain the fine-tuning example adapts PP-OCRv4 to. Without a model: it loads through
data.source, is deterministic and cached, its lines are short, a wrong style is refused in one line, and
`ocr_lines` is byte for byte what it was."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from pipeline import config as config_mod, pretrained
from pipeline.errors import InputError
from pipeline.tasks.ocr_rec import data, lines, text

SOURCE = "ocr_lines_dotmatrix"
# ocr_lines before the second source existed (main at 3052d3c, computed there with this venv's Pillow and
# font): the cache file's name (the cache key) and the sha256 of every image's bytes, train, val, test in order
OCR_LINES_12_3_3 = ("12-3-3-33f0deacdf18fce4", "28aa9cff8e0a643945d4603aa6f0705c76f962377f262fa205a49d5322601d9a")
OCR_LINES_FIRST = ((49, 511, 3), "5c4553e40b26d9f62d07ba8f6dbfc4e34b696e95d144d0179f020d1e94e10a21")


@pytest.fixture(scope="module")
def keys() -> tuple[str, ...]:
    return text.read_keys(pretrained.ppocr() / pretrained.KEYS)


def _cfg(source: str, n: int, cache) -> object:
    return config_mod.load(None, [f"data.source={source}", f"data.ocr_lines={n}", f"data.cache_dir={cache}"]).data


def test_the_source_loads_through_data_source_and_is_cached(tmp_path, keys):
    first = data.load(_cfg(SOURCE, 20, tmp_path), keys)
    assert (len(first.train), len(first.val), len(first.test)) == (20, 3, 3)  # as ocr_lines: 15% each
    (npz,) = (tmp_path / SOURCE).glob("*.npz")
    assert not (tmp_path / "ocr_lines").exists()
    again = data.load(_cfg(SOURCE, 20, tmp_path), keys)
    for s in ("train", "val", "test"):
        a, b = getattr(first, s), getattr(again, s)
        assert a.texts == b.texts and [i.tobytes() for i in a.images] == [i.tobytes() for i in b.images]
    every = first.train.texts + first.val.texts + first.test.texts
    assert set("".join(every)) <= set(keys)
    for im in first.train.images:
        assert im.dtype == np.uint8 and im.ndim == 3 and im.shape[2] == 3
        grey = im.mean(axis=2)
        assert np.percentile(grey, 99) - grey.min() > 80  # dots of ink on paper, not a blank line
    # the style is in the cache key: ocr_lines of the same count and keys is another file
    data.load(_cfg("ocr_lines", 20, tmp_path), keys)
    (plain,) = (tmp_path / "ocr_lines").glob("*.npz")
    assert plain.stem != npz.stem


def test_same_seed_same_bytes_another_seed_other_lines(keys):
    a, b = (data.styled((12, 3, 3), keys, "dotmatrix", seed=3) for _ in range(2))
    for s in ("train", "val", "test"):
        x, y = getattr(a, s), getattr(b, s)
        assert x.texts == y.texts and [i.tobytes() for i in x.images] == [i.tobytes() for i in y.images]
    assert data.styled((12, 3, 3), keys, "dotmatrix", seed=4).train.texts != a.train.texts


def test_lines_are_short_pieces_of_the_corpus(keys):
    """2-10 characters, each a piece of the corpus line drawn for it, and at most 320 px wide once prepared
    (height 48): every training batch is at the minimum width (training cost is linear in width)."""
    n = 60
    got = data.styled((n, 0, 0), keys, "dotmatrix", seed=0).train
    text_seed = data.style_seeds(0)[0]
    pieces, source = data.short_lines(keys, n, text_seed), data.corpus_lines(keys, n, text_seed)
    assert all(2 <= len(t) <= 10 for t in got.texts), got.texts
    assert all(p in s for p, s in zip(pieces, source, strict=True))
    assert all(p.startswith(t) for t, p in zip(got.texts, pieces, strict=True))  # cut at the end to fit
    assert sum(t != p for t, p in zip(got.texts, pieces)) < n / 3
    assert source != data.corpus_lines(keys, n, 0)  # not ocr_lines' own lines
    assert np.mean([len(t) for t in got.texts]) > 4
    widths = [lines.width(i.shape[0], i.shape[1], 10 ** 6) for i in got.images]
    assert max(widths) <= 320 and lines.batch_width(widths, 64, 320) == 320


def test_ocr_lines_is_unchanged(tmp_path, keys):
    """Byte-identical output and cache key to before ocr_lines_dotmatrix existed."""
    got = data._generated((12, 3, 3), keys, tmp_path)
    (npz,) = (tmp_path / "ocr_lines").glob("*.npz")
    assert npz.stem == OCR_LINES_12_3_3[0]
    h = hashlib.sha256()
    for s in ("train", "val", "test"):
        for im in getattr(got, s).images:
            h.update(im.tobytes())
    assert h.hexdigest() == OCR_LINES_12_3_3[1]
    first = got.train.images[0]
    assert (first.shape, hashlib.sha256(first.tobytes()).hexdigest()) == OCR_LINES_FIRST
    assert got.train.texts[:2] == ["点USB不习惯，，看久了觉得很不错！！反", "里面根本粘和"]


def test_a_wrong_style_is_refused_in_one_line_naming_data_source(tmp_path, keys):
    with pytest.raises(InputError) as e:
        data.load(_cfg("ocr_lines_dotmatrx", 20, tmp_path), keys)
    msg = str(e.value)
    assert msg.startswith("data.source ocr_lines_dotmatrx: no such style") and "\n" not in msg
    assert SOURCE in msg  # names what there is
    assert not tmp_path.joinpath("ocr_lines_dotmatrx").exists()


def test_a_folder_of_that_name_stays_a_folder(tmp_path, keys, monkeypatch):
    from PIL import Image

    folder = tmp_path / "ocr_lines_mine"
    folder.mkdir()
    for i in range(4):
        Image.new("RGB", (40, 20), "white").save(folder / f"{i}.png")
    (folder / "train.txt").write_text("".join(f"{i}.png\t文{i}\n" for i in range(4)), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    d = data.load(_cfg("ocr_lines_mine", 20, tmp_path / "cache"), keys)
    assert sorted(d.train.texts + d.val.texts + d.test.texts) == [f"文{i}" for i in range(4)]


def test_the_scan_style_is_another_font_and_other_texts_deterministic(tmp_path, keys):
    """ocr_lines_scan, finetune.held_out's default: whole corpus lines (not dot-matrix pieces), not ocr_lines' texts,
    drawn in Noto Sans CJK Light (not the Regular every other style uses), as JPEG-degraded grey scans; the same
    bytes for the same seed, cached under its own name."""
    a = data.load(_cfg("ocr_lines_scan", 40, tmp_path), keys)
    assert (len(a.train), len(a.val), len(a.test)) == (40, 6, 6)
    (npz,) = (tmp_path / "ocr_lines_scan").glob("*.npz")
    b = data.styled((40, 6, 6), keys, "scan", seed=0)
    assert a.val.texts == b.val.texts and [i.tobytes() for i in a.val.images] == [i.tobytes() for i in b.val.images]
    every = a.train.texts + a.val.texts + a.test.texts
    assert set("".join(every)) <= set(keys) and max(len(t) for t in every) > 10  # whole lines, not date codes
    text_seed = data.style_seeds(0)[0]
    assert every == data.corpus_lines(keys, 52, text_seed) and not set(every) & set(data.corpus_lines(keys, 52, 0))
    assert data.font_path("Light") != data.font_path() and data.font_path("Light").is_file()
    for im in a.val.images:
        assert im.dtype == np.uint8 and im.ndim == 3 and im.shape[2] == 3
        grey = im.mean(axis=2)
        assert np.percentile(grey, 95) < 250  # a grey ground, never a white page
        assert np.percentile(grey, 99) - grey.min() > 80  # and ink on it
