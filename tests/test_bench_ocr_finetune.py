"""The fine-tuning bench's unseen styles (pipeline/bench/ocr_finetune.py `unseen_rows`): lines drawn in fonts no part
of pipe's data uses (make's set-up puts them in .venv/fonts), and how `pipe predict`'s rows are scored."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from pipeline import pretrained
from pipeline.bench import ocr_finetune as bench
from pipeline.tasks.ocr_rec import data as rec_data, text


@pytest.fixture(scope="module")
def keys() -> list[str]:
    return text.read_keys(pretrained.ppocr() / pretrained.KEYS)


@pytest.mark.parametrize("style", range(len(bench.UNSEEN)))
def test_each_unseen_style_draws_seeded_lines_of_the_keys_in_its_own_font(style, keys, tmp_path):
    name, font, degraded = bench.UNSEEN[style]
    if not (bench.FONTS / font).is_file():
        pytest.skip(f"{bench.FONTS / font} missing: make's set-up installs it")
    assert (bench.FONTS / font).resolve() != rec_data.font_path().resolve()  # not the built-in lines' font
    a = bench.unseen_lines(tmp_path / "a", bench.FONTS / font, degraded, keys, 4)
    b = bench.unseen_lines(tmp_path / "b", bench.FONTS / font, degraded, keys, 4)
    assert a == b and len(a) == 4 and all(set(t) <= set(keys) for t in a.values())
    for f in a:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()  # seeded
        im = np.asarray(Image.open(tmp_path / "a" / f))
        assert im.ndim == 3 and im.shape[0] >= 26 and im.shape[1] > im.shape[0]
        corners = im[[0, 0, -1, -1], [0, -1, 0, -1]]
        assert degraded or (corners == 255).all()  # black on white unless drawn as the built-in lines are
        assert im.min() < 100  # ink


def test_line_accuracy_compares_after_nfkc_and_counts_a_missing_row_wrong(tmp_path):
    texts = {"0.png": "价格，合理", "1.png": "好评", "2.png": "没有读到"}
    rows = [{"source": str(tmp_path / "0.png"), "answer": {"lines": [{"text": "价格,合理", "score": 0.9}]}},
            {"source": str(tmp_path / "1.png"), "answer": {"lines": [{"text": "好 评", "score": 0.9}]}}]
    pred = tmp_path / "predictions.jsonl"
    pred.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert bench.line_accuracy(pred, texts, {"ignore_space": True}) == pytest.approx(2 / 3)
    assert bench.line_accuracy(pred, texts, {"ignore_space": False}) == pytest.approx(1 / 3)
