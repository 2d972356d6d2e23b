"""ocr_rec's training-line augmentation (pipeline/tasks/ocr_rec/augment.py), without a model: seeded by its
generator only, RGB uint8 in and out, the margin crop never cuts ink, every kind happens at about its
probability, and degenerate lines (1 px high or wide, blank) pass through."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.tasks.ocr_rec import augment as aug, data

TEXTS = ["中文识别", "PP-OCR 2026", "价格，很好！", "No.7 USB", "一二", "测试wi-fi质量"]


@pytest.fixture(scope="module")
def rendered() -> list[np.ndarray]:
    """data.render's lines (the built-in generator's look), several sizes, inks and papers."""
    rngs = np.random.default_rng(0).spawn(24)
    return [data.render(TEXTS[i % len(TEXTS)], r, data.font_path()) for i, r in enumerate(rngs)]


def test_the_same_generator_state_gives_the_same_bytes(rendered):
    for i, line in enumerate(rendered[:8]):
        a = aug.augment(line, np.random.default_rng(i))
        b = aug.augment(line, np.random.default_rng(i))
        assert a.dtype == np.uint8 and a.ndim == 3 and a.shape[2] == 3
        assert a.shape == b.shape and a.tobytes() == b.tobytes()
    rng = np.random.default_rng(5)
    draws = [aug.augment(rendered[0], rng) for _ in range(6)]
    assert len({d.tobytes() for d in draws}) > 1  # the generator moves on: not one fixed transform
    assert np.array_equal(rendered[0], data.render(TEXTS[0], np.random.default_rng(0).spawn(24)[0],
                                                   data.font_path()))  # the input is not written to


def test_the_margin_crop_never_removes_ink(rendered):
    """Every dark pixel's column and row survive (darker than halfway from the paper to the darkest ink):
    the crop is one rectangle, so it must span them all."""
    rng = np.random.default_rng(1)
    cut = 0
    for line in rendered:
        grey = line.astype(np.float32).mean(axis=2)
        bg = np.median(np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]]))
        dark = grey < bg - 0.5 * (bg - grey.min())
        rows, cols = np.flatnonzero(dark.any(axis=1)), np.flatnonzero(dark.any(axis=0))
        for _ in range(20):
            state = rng.bit_generator.state
            t, b, l, r = aug.crop_box(line, rng)
            assert t <= rows[0] and rows[-1] < b and l <= cols[0] and cols[-1] < r, ((t, b, l, r), rows, cols)
            rng.bit_generator.state = state
            out = aug.crop_margins(line, rng)
            assert np.array_equal(out, line[t:b, l:r])
            # a dark pixel is kept with its whole column: count the ink per column, before and after
            assert np.array_equal(dark[:, l:r].sum(axis=0)[cols - l], dark.sum(axis=0)[cols])
            cut += out.shape != line.shape
    assert cut > 0.8 * 20 * len(rendered)  # margins were there to cut, and were cut


def test_the_ink_box_of_a_drawn_line_holds_its_ink_and_a_blank_line_has_none():
    line = np.full((40, 120, 3), 235, np.uint8)
    line[12:30, 20:90] = 30
    assert aug.ink_box(line) == (12, 30, 20, 90)
    noisy = np.clip(235 + np.random.default_rng(0).normal(0, 6, (40, 120, 3)), 0, 255).astype(np.uint8)
    assert aug.ink_box(noisy) is None  # paper noise is not ink
    light_on_dark = 255 - line
    assert aug.ink_box(light_on_dark) == (12, 30, 20, 90)
    assert np.array_equal(aug.crop_margins(noisy, np.random.default_rng(0)), noisy)


def test_with_many_draws_each_kind_happens_at_about_its_probability(rendered, monkeypatch):
    calls = {name: 0 for name in ("crop_margins", "warp", "blur", "jitter_colour", "add_noise")}
    for name in calls:
        real = getattr(aug, name)

        def counted(image, rng, _real=real, _name=name):
            calls[_name] += 1
            return _real(image, rng)

        monkeypatch.setattr(aug, name, counted)
    rng = np.random.default_rng(2)
    n = 400
    for i in range(n):
        aug.augment(rendered[i % len(rendered)], rng)
    for name, k in calls.items():
        assert 0.3 * n < k < 0.5 * n, (name, k)  # PROB 0.4; 5 sigma is +-0.12


def test_each_kind_changes_the_line_and_keeps_it_readable_in_size(rendered):
    line = rendered[3]
    h, w = line.shape[:2]
    for name in ("warp", "blur", "jitter_colour", "add_noise"):
        changed = [getattr(aug, name)(line, np.random.default_rng(s)) for s in range(5)]
        assert all(c.dtype == np.uint8 and c.shape[2] == 3 for c in changed)
        assert any(c.shape != line.shape or np.abs(c.astype(int) - line).mean() > 0.5 for c in changed), name
    for s in range(20):  # mild: corners in by up to h/10 each, then a tilt that lifts one end by up to h/5
        out = aug.warp(line, np.random.default_rng(s))
        assert 0.8 * h - 1 <= out.shape[0] <= 1.2 * h + 2, (out.shape, line.shape)
        assert 0.99 * w - 1 <= out.shape[1] <= w + 0.04 * h + 2, (out.shape, line.shape)
    # colour jitter keeps the ink apart from the paper
    for s in range(20):
        out = aug.jitter_colour(line, np.random.default_rng(s)).astype(np.float32).mean(axis=2)
        assert np.percentile(out, 99) - np.percentile(out, 1) > 0.5 * (np.percentile(line.mean(axis=2), 99) -
                                                                    np.percentile(line.mean(axis=2), 1))


@pytest.mark.parametrize("shape, fill", [((1, 50, 3), 255), ((30, 1, 3), 255), ((1, 1, 3), 0),
                                         ((40, 200, 3), 255), ((5, 300, 3), 128)])
def test_degenerate_lines_do_not_crash(shape, fill):
    image = np.full(shape, fill, np.uint8)
    rng = np.random.default_rng(3)
    for _ in range(40):
        out = aug.augment(image, rng)
        assert out.dtype == np.uint8 and out.ndim == 3 and out.shape[2] == 3 and min(out.shape[:2]) >= 1
    for name in ("crop_margins", "warp", "blur", "jitter_colour", "add_noise"):
        out = getattr(aug, name)(image, np.random.default_rng(4))
        assert out.dtype == np.uint8 and out.shape[2] == 3 and min(out.shape[:2]) >= 1, name


def test_a_wrong_image_is_refused():
    with pytest.raises(ValueError, match="RGB uint8"):
        aug.augment(np.zeros((10, 10), np.uint8), np.random.default_rng(0))
    with pytest.raises(ValueError, match="RGB uint8"):
        aug.augment(np.zeros((10, 10, 3), np.float32), np.random.default_rng(0))
