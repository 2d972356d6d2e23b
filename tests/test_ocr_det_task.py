"""ocr_det's contract against upstream's definitions (PaddleOCR's DetResizeForTest + NormalizeImage, DBPostProcess,
DetMetric / DetectionIoUEvaluator, detection label files) on hand-made cases, and its generated pages. The real
PP-OCRv4 detector through all of it: tests/stages/test_import_ocr_det.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import config as config_mod, tasks
from pipeline.errors import InputError
from pipeline.tasks import ocr_det
from pipeline.tasks.ocr_det import data, db, metric, pages

INFO = tasks.Info(ocr_det.LABELS, dict(ocr_det.settings))


# ------------------------------------------------------------------ pre-processing


@pytest.mark.parametrize("hw, want", [
    ((500, 700), (512, 704)),    # no scaling below 960; 15.6 -> 16 and 21.9 -> 22 strides of 32
    ((1024, 600), (960, 576)),   # long side 1024 > 960: x 0.9375 -> 960 x 562 -> 576
    ((600, 2000), (288, 960)),   # 600 x 0.48 = 288
    ((10, 20), (32, 32)),        # at least one stride
])
def test_resize_as_det_resize_for_test(hw, want):
    img = np.zeros((*hw, 3), np.uint8)
    x, shape = pages.prepare(img, 960, "max")
    assert x.shape == (3, *want) and x.dtype == np.float32
    assert shape == (hw[0], hw[1], want[0] / hw[0], want[1] / hw[1])


def test_limit_type_min_scales_up_and_unknown_is_refused():
    assert pages.resized_size(300, 500, 736, "min") == (736, 1216)  # 300 -> 736: x 2.4533, 500 -> 1226 -> 1216
    with pytest.raises(InputError, match="limit_type 'side'"):
        pages.resized_size(300, 500, 736, "side")


def test_normalisation_is_bgr_with_imagenet_constants_in_paddleocr_order():
    """A red RGB page is (0, 0, 255) in BGR: channel 0 gets (0 - 0.485) / 0.229, channel 2 (1 - 0.406) / 0.225,
    as PaddleOCR's NormalizeImage on cv2.imread's BGR array."""
    img = np.zeros((64, 64, 3), np.uint8)
    img[..., 0] = 255
    x, _ = pages.prepare(img, 960, "max")
    assert x[0, 0, 0] == pytest.approx((0 - 0.485) / 0.229, abs=1e-6)
    assert x[1, 0, 0] == pytest.approx((0 - 0.456) / 0.224, abs=1e-6)
    assert x[2, 0, 0] == pytest.approx((1 - 0.406) / 0.225, abs=1e-6)


@pytest.mark.parametrize("hw", [(64, 64), (700, 1100), (37, 301)])
def test_prepare_is_paddleocrs_resize_and_normalise_of_the_bgr_page_exactly(hw):
    """cv2's channel swap in prepare gives, bit for bit, what numpy's reversed-channel copy of the page did, on
    pages scaled down, up and not at all, from a contiguous array and from a view."""
    import cv2

    page = np.random.default_rng(0).integers(0, 256, (*hw, 3), dtype=np.uint8)
    for img in (page, page[:, 1:]):
        x, shape = pages.prepare(img, 960, "max")
        bgr = cv2.resize(np.ascontiguousarray(img[:, :, ::-1]), (x.shape[2], x.shape[1]))
        want = ((bgr.astype(np.float32) * pages.SCALE - pages.MEAN) / pages.STD).transpose(2, 0, 1)
        assert x.dtype == want.dtype and np.array_equal(x, want)


def test_batches_are_one_page_each_in_order():
    split = data.Pages([np.zeros((100 + 40 * i, 300, 3), np.uint8) for i in range(3)], [[], [], []], [[], [], []])
    got = list(ocr_det.batches(split, INFO, 8))
    assert [p for p, _ in got] == [[0], [1], [2]]
    assert [f["x"].shape for _, f in got] == [(1, 3, 96, 288), (1, 3, 128, 288), (1, 3, 192, 288)]
    assert [p for p, _ in ocr_det.batches(split, INFO, 8, rows=[2, 0])] == [[2], [0]]
    assert [p for p, _ in ocr_det.batches(split, INFO, 8, limit=1)] == [[0]]


# ------------------------------------------------------------------ DB post-processing


def _map(h: int = 64, w: int = 128) -> np.ndarray:
    return np.zeros((1, 1, h, w), np.float32)


def test_one_text_region_gives_its_unclipped_box_mapped_to_the_page():
    """A 60 x 10 block at 0.9: the contour's min-area box is x 20..79, y 10..19 (59 x 9), score 0.9; unclip
    grows it by 59 * 9 * 1.5 / (2 * (59 + 9)) = 5.86 px a side: about x 14.1..84.9, y 4.1..24.9."""
    m = _map()
    m[0, 0, 10:20, 20:80] = 0.9
    (page,) = db.decode(m, INFO.settings)
    assert page.map_size == (64, 128) and page.scores == [pytest.approx(0.9)]
    (box,) = page.boxes
    np.testing.assert_allclose(box, [[14.1, 4.1], [84.9, 4.1], [84.9, 24.9], [14.1, 24.9]], atol=1.0)
    # the page was 128 x 256 (the map is half its size): x / 128 * 256, rounded, clipped to the page
    (on_page,) = db.to_source(page, 128, 256)
    np.testing.assert_array_equal(on_page, np.round(box * 2))
    assert on_page.min() >= 0 and on_page[..., 0].max() <= 256


def test_low_scores_small_regions_and_settings():
    m = _map()
    m[0, 0, 10:20, 20:80] = 0.5   # above thresh 0.3, below box_thresh 0.6: dropped
    m[0, 0, 40:42, 100:102] = 0.99  # 2 x 2: its min-area box's short side 1 < min_size 3
    assert len(db.decode(m, INFO.settings)[0].boxes) == 0
    lower = {**INFO.settings, "box_thresh": 0.4}
    assert len(db.decode(m, lower)[0].boxes) == 1
    slow = {**INFO.settings, "box_thresh": 0.4, "score_mode": "slow"}
    assert db.decode(m, slow)[0].scores == [pytest.approx(0.5)]


def test_system_info_grows_boxes_by_system_unclip_ratio_and_keeps_the_detectors_own():
    """The OCR system decodes with `system_info`: unclip_ratio replaced by system_unclip_ratio (2.0 by default),
    so the 60 x 10 block grows by 59 * 9 * 2.0 / 136 = 7.81 px a side instead of 5.86; the detector's own
    settings (its metric, /v1/predict) keep unclip_ratio; a user's system_unclip_ratio is what the system uses."""
    m = _map()
    m[0, 0, 10:20, 20:80] = 0.9
    sys_info = ocr_det.system_info(INFO)
    assert INFO.settings["unclip_ratio"] == 1.5 and sys_info.settings["unclip_ratio"] == 2.0
    assert ocr_det.system_info(sys_info) == sys_info  # idempotent: a caller may apply it twice
    (box,) = ocr_det.decode({"maps": m}, sys_info)[0].boxes
    np.testing.assert_allclose(box, [[12.2, 2.2], [86.8, 2.2], [86.8, 26.8], [12.2, 26.8]], atol=1.0)
    (own,) = ocr_det.decode({"maps": m}, INFO)[0].boxes
    assert ((box[2] - box[0]) > (own[2] - own[0])).all()  # wider and taller than the detector's own box
    mine = ocr_det.system_info(tasks.Info(INFO.labels, {**INFO.settings, "system_unclip_ratio": 1.6}))
    np.testing.assert_array_equal(ocr_det.decode({"maps": m}, mine)[0].boxes,
                                  db.decode(m, {**INFO.settings, "unclip_ratio": 1.6})[0].boxes)
    old = {k: v for k, v in INFO.settings.items() if k != "system_unclip_ratio"}  # an artifact from before the key
    assert ocr_det.system_info(tasks.Info(INFO.labels, old)).settings["unclip_ratio"] == 2.0
    with pytest.raises(InputError, match="system_unclip_ratio 0.0: must be above 0"):
        ocr_det.system_info(tasks.Info(INFO.labels, {**INFO.settings, "system_unclip_ratio": 0}))


def test_a_turned_region_gives_points_clockwise_from_the_top_left():
    import cv2

    m = _map(128, 256)
    rect = ((128.0, 64.0), (150.0, 20.0), -10.0)  # centre, size, angle: a line turned by 10 degrees
    cv2.fillPoly(m[0, 0], [cv2.boxPoints(rect).astype(np.int32)], 0.95)
    (box,) = db.decode(m, INFO.settings)[0].boxes
    tl, tr, br, bl = box
    assert tl[0] < tr[0] and bl[0] < br[0] and tl[1] < bl[1] and tr[1] < br[1]
    x, y = box[:, 0], box[:, 1]
    assert 0.5 * np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) > 0  # clockwise on screen (y down)
    angle = np.degrees(np.arctan2(tr[1] - tl[1], tr[0] - tl[0]))
    assert abs(abs(angle) - 10) < 1.5


def test_several_pages_and_max_candidates():
    m = np.zeros((2, 1, 64, 128), np.float32)
    m[0, 0, 5:15, 10:50] = m[0, 0, 30:40, 10:50] = 0.9
    m[1, 0, 20:30, 60:120] = 0.8
    got = db.decode(m, INFO.settings)
    assert [len(p.boxes) for p in got] == [2, 1]
    assert [len(p.boxes) for p in db.decode(m, {**INFO.settings, "max_candidates": 1})] == [1, 1]
    ans = ocr_det.answer({"maps": m}, INFO, [(128, 256), (64, 128)])
    assert [len(p) for p in ans["boxes"]] == [2, 1]
    assert all(len(b["points"]) == 4 and isinstance(b["score"], float) for p in ans["boxes"] for b in p)
    # in each page's own pixels: page 0's map is half its size
    assert ans["boxes"][0][0]["points"] == (db.to_source(got[0], 128, 256)[0]).tolist()


# ------------------------------------------------------------------ the metric


def _sq(x0, y0, x1, y1):
    return np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float32)


def _score(gt, texts, det):
    return metric.combine([metric.page_counts(gt, [metric.is_dont_care(t) for t in texts], det)])


def test_metric_hand_cases():
    g = _sq(0, 0, 10, 10)
    assert _score([g], ["a"], [g]) == {"hmean": 1.0, "precision": 1.0, "recall": 1.0}
    # IoU 50 / 150 = 0.33 is no match; IoU 0.5 exactly is none either (upstream: strictly above)
    assert _score([g], ["a"], [_sq(5, 0, 15, 10)])["hmean"] == 0.0
    assert _score([g], ["a"], [_sq(0, 0, 10, 20)])["hmean"] == 0.0  # 100 / 200
    assert _score([g], ["a"], [_sq(0, 0, 10, 19)])["recall"] == 1.0  # 100 / 190
    # one to one: two detections on one line, one matches
    got = _score([g], ["a"], [g, _sq(1, 1, 10, 10)])
    assert got == {"hmean": pytest.approx(2 / 3), "precision": 0.5, "recall": 1.0}
    # no detections at all, no ground truth at all
    assert _score([g], ["a"], []) == {"hmean": 0.0, "precision": 0.0, "recall": 0.0}


def test_dont_care_lines_and_detections_mostly_inside_them_do_not_count():
    care, dont = _sq(0, 0, 10, 10), _sq(20, 0, 40, 10)
    inside = _sq(22, 0, 38, 10)        # all of it in the "###" line: ignored
    half_out = _sq(30, 0, 52, 10)      # 10 of 22 wide inside (45%): a false positive
    got = _score([care, dont], ["a", "###"], [care, inside])
    assert got == {"hmean": 1.0, "precision": 1.0, "recall": 1.0}
    got = _score([care, dont], ["a", "*"], [care, inside, half_out])
    assert got == {"hmean": pytest.approx(2 / 3), "precision": 0.5, "recall": 1.0}  # 2 x 0.5 x 1 / 1.5
    # a detection on a don't-care line is never matched to it, even when the IoU is 1
    assert _score([dont], ["###"], [dont]) == {"hmean": 0.0, "precision": 0.0, "recall": 0.0}


def test_metric_sums_over_pages_and_skips_invalid_polygons():
    g = _sq(0, 0, 10, 10)
    bowtie = np.array([[0, 0], [10, 10], [10, 0], [0, 10]], np.float32)  # self-intersecting: dropped
    pages_ = [metric.page_counts([g], [False], [g]), metric.page_counts([g, g + 20], [False, False], [bowtie])]
    assert metric.combine(pages_) == {"hmean": pytest.approx(0.5), "precision": 1.0, "recall": pytest.approx(1 / 3)}


def test_score_maps_answers_to_each_pages_pixels():
    """`score` takes decoded pages in map coordinates and ground truth in page pixels (here twice the map)."""
    m = _map()
    m[0, 0, 10:20, 20:80] = 0.9
    answers = ocr_det.decode({"maps": m}, INFO)
    truth = db.to_source(answers[0], 128, 256)[0]
    split = data.Pages([np.zeros((128, 256, 3), np.uint8)], [[truth]], [["x"]])
    assert ocr_det.score(answers, split, INFO) == {"hmean": 1.0, "precision": 1.0, "recall": 1.0}
    half = data.Pages([np.zeros((64, 128, 3), np.uint8)], [[truth]], [["x"]])  # the same truth on a smaller page
    assert ocr_det.score(answers, half, INFO)["hmean"] == 0.0


# ------------------------------------------------------------------ what package and serve call


def test_the_long_side_stays_within_max_side_and_the_limits_say_so():
    """'min' scales a long, thin page up by its short side; PaddleOCR 3's max_side_limit (4000) caps the long
    side, and sample_limits is the largest page tensor the settings give (a /v2 tensor beyond: 422)."""
    assert pages.resized_size(100, 3000, 736, "min") == (128, 4000)  # x 7.36 = 736 x 22080, then x 0.18
    assert pages.resized_size(100, 3000, 960, "max") == (32, 960)
    assert ocr_det.sample_limits(INFO) == (3, 960, 960)
    assert ocr_det.sample_limits(tasks.Info(ocr_det.LABELS, {**ocr_det.settings, "limit_type": "min",
                                                               "limit_side_len": 736})) == (3, 4000, 4000)
    assert ocr_det.example_shapes(INFO) == [(3, 960, 704), (3, 704, 960)]  # a 3:4 page upright and on its side


def test_prepare_images_batches_pages_of_one_prepared_shape():
    ims = [np.full((h, w, 3), 40 * i, np.uint8) for i, (h, w) in enumerate(
        [(100, 300), (500, 700), (101, 299), (100, 300), (98, 302)])]
    got = ocr_det.prepare_images(ims, INFO, 2)
    # 100x300, 101x299 and 98x302 all prepare to 96 x 288; 500x700 to 512 x 704; at most 2 per batch
    assert [(pos, x.shape) for pos, x in got] == [([0, 2], (2, 3, 96, 288)), ([3, 4], (2, 3, 96, 288)),
                                                 ([1], (1, 3, 512, 704))]
    for pos, x in got:
        for k, p in enumerate(pos):
            np.testing.assert_array_equal(x[k], pages.prepare(ims[p], 960, "max")[0])


def test_reference_set_fits_pages_into_one_square_and_scales_their_polygons():
    cfg = dataclasses.replace(config_mod.RunConfig().data, source=data.BUILT_IN, ocr_pages=7)  # 7, 1 val, 1 test
    x, targets = ocr_det.reference_set(cfg, INFO, 256)
    ds = ocr_det.load_data(cfg, INFO)
    assert x.shape == (2, 3, ocr_det.REFERENCE_SIDE, ocr_det.REFERENCE_SIDE) and len(targets) == 2
    for k, page in enumerate([ds.test.images[0], ds.val.images[0]]):  # the test split's first, then val's
        want, shape = pages.prepare(page, ocr_det.REFERENCE_SIDE, "max")
        h, w = want.shape[1:]
        np.testing.assert_array_equal(x[k, :, :h, :w], want)
        assert not x[k, :, h:].any() and not x[k, :, :, w:].any()  # padded with the normalised mean colour
        polys = (ds.test if k == 0 else ds.val).polys[0]
        np.testing.assert_allclose(targets[k][0][0], polys[0] * [shape.ratio_w, shape.ratio_h], rtol=1e-6)
    assert ocr_det.reference_set(cfg, INFO, 1)[0].shape[0] == 1


def test_metrics_of_scores_boxes_in_the_maps_own_pixels():
    m = _map()
    m[0, 0, 10:20, 20:80] = 0.9
    (page,) = ocr_det.decode({"maps": m}, INFO)
    assert ocr_det.metrics_of({"maps": m}, [([page.boxes[0]], ["x"])], INFO)["hmean"] == 1.0
    assert ocr_det.metrics_of({"maps": m}, [([page.boxes[0] + [0, 30]], ["x"])], INFO)["hmean"] == 0.0
    assert ocr_det.metrics_of({"maps": m}, [([page.boxes[0]], ["###"])], INFO)["precision"] == 0.0  # 0 of 0


def test_reference_agreement_holds_boxes_at_the_metrics_iou():
    m = np.zeros((3, 1, 64, 128), np.float32)
    m[:, 0, 10:20, 20:80] = 0.9
    m[:, 0, 40:50, 20:100] = 0.8
    ref = ocr_det.reference_digest({"maps": m}, INFO)
    assert ref["maps"].dtype == np.float16 and ref["maps"].shape == m.shape
    assert ocr_det.reference_agreement(ref, ref, INFO) == 1.0
    moved = m.copy()
    moved[1] = 0
    moved[1, 0, 11:21, 21:81] = 0.9  # a pixel down and right: the same line
    moved[1, 0, 40:50, 20:100] = 0.8
    moved[2, 0, 40:50] = 0  # page 2 loses its second line: P 1, R 0.5, hmean 2/3
    got = ocr_det.reference_digest({"maps": moved}, INFO)
    assert ocr_det.reference_agreement(got, ref, INFO) == pytest.approx((1 + 1 + 2 / 3) / 3)
    empty = ocr_det.reference_digest({"maps": np.zeros_like(m)}, INFO)
    assert ocr_det.reference_agreement(empty, empty, INFO) == 1.0  # neither finds text: they agree
    assert ocr_det.reference_agreement(empty, ref, INFO) == 0.0


def test_subset_keeps_the_rows_in_order():
    split = data.Pages([np.full((4, 4, 3), i, np.uint8) for i in range(3)], [[np.zeros((4, 2))]] * 3, [["a"], ["b"], ["c"]])
    sub = ocr_det.subset(split, [2, 0])
    assert [int(im[0, 0, 0]) for im in sub.images] == [2, 0] and sub.texts == [["c"], ["a"]]


# ------------------------------------------------------------------ generated pages


@pytest.fixture(scope="module")
def generated():
    return data.generated((8, 2, 2), seed=7)


def test_pages_same_seed_same_bytes(generated):
    again = data.generated((8, 2, 2), seed=7)
    for s in ("train", "val", "test"):
        a, b = getattr(generated, s), getattr(again, s)
        assert [i.tobytes() for i in a.images] == [i.tobytes() for i in b.images]
        assert a.texts == b.texts and all(np.array_equal(x, y) for p, q in zip(a.polys, b.polys) for x, y in zip(p, q))
    other = data.generated((1, 0, 0), seed=8).train
    assert other.images[0].tobytes() != generated.train.images[0].tobytes()


def test_pages_sizes_lines_and_quadrilaterals(generated):
    every = [(getattr(generated, s), i) for s in ("train", "val", "test") for i in range(len(getattr(generated, s)))]
    assert [len(getattr(generated, s)) for s in ("train", "val", "test")] == [8, 2, 2]
    turned = 0
    for split, i in every:
        img, polys, texts = split.images[i], split.polys[i], split.texts[i]
        h, w = img.shape[:2]
        assert img.dtype == np.uint8 and 480 <= h <= 1024 and 480 <= w <= 1024
        assert 1 <= len(polys) == len(texts) <= 12 and all(len(t) >= 2 for t in texts)
        for q in polys:
            assert q.shape == (4, 2) and q[:, 0].min() >= 0 and q[:, 0].max() <= w and q[:, 1].max() <= h
            x, y = q[:, 0], q[:, 1]
            assert 0.5 * np.sum(x * np.roll(y, -1) - np.roll(x, -1) * y) > 0  # clockwise from the top left
            assert q[0].sum() == min(p.sum() for p in q)
        turned += any(abs(q[0, 1] - q[1, 1]) > 2 for q in polys)
    assert sum(len(split.polys[i]) for split, i in every) >= 3 * len(every)  # 3-12 lines a page, most fit
    assert 1 <= turned < len(every)  # some pages turned, not all


def test_ink_lies_inside_the_quadrilaterals(generated):
    """Everything that differs from the page's ground around a line is inside its quadrilateral: the truth
    covers the text (checked on a blank re-draw of a page: the line masks against the quads)."""
    import cv2

    img = generated.train.images[0].astype(np.int16)
    inside = np.zeros(img.shape[:2], np.uint8)
    for q in generated.train.polys[0]:
        cv2.fillPoly(inside, [np.round(q).astype(np.int32)], 1)
    grown = cv2.dilate(inside, np.ones((5, 5), np.uint8))  # BICUBIC edges and rounding: 2 px
    edges = np.abs(np.diff(img.mean(2), axis=1))
    assert edges[:, :][grown[:, 1:] == 0].max() < 40  # no glyph edge outside the lines' boxes
    assert edges[grown[:, 1:] == 1].max() > 60  # and glyphs inside them


# ------------------------------------------------------------------ label files


def _folder(root: Path, files: dict[str, str]) -> Path:
    from PIL import Image

    (root / "img").mkdir(parents=True)
    for i in range(8):
        Image.new("RGB", (200 + i, 100), "white").save(root / "img" / f"{i}.png")
    for name, body in files.items():
        (root / name).write_text(body, encoding="utf-8")
    return root


def _line(i: int, labels: list) -> str:
    return f"img/{i}.png\t{json.dumps(labels, ensure_ascii=False)}"


def _load(root: Path | str) -> data.Data:
    return data.load(config_mod.load(None, [f"data.source={root}"]).data)


def test_label_files_with_dont_care_and_polygons_of_more_points(tmp_path):
    quad = [[10, 10], [50, 10], [50, 30], [10, 30]]
    poly = [[60, 10], [90, 8], [120, 10], [120, 30], [90, 32], [60, 30]]
    rows = [_line(i, [{"transcription": "文字", "points": quad}, {"transcription": "###", "points": poly}])
            for i in range(6)]
    root = _folder(tmp_path / "d", {"train.txt": "\n".join(rows) + "\n",
                                    "test.txt": _line(7, [{"transcription": "x", "points": quad}])})
    d = _load(root)
    assert (len(d.train), len(d.val), len(d.test)) == (5, 1, 1)  # val carved out of train, test given
    assert d.train.texts[0] == ["文字", "###"] and d.train.polys[0][1].shape == (6, 2)
    assert d.test.images[0].shape == (100, 207, 3)


@pytest.mark.parametrize("line, needle", [
    ("img/0.png [{}]", "train.txt:2: no tab between the image path and its labels"),
    ("img/0.png\t[{\"transcription\": \"a\", ", "train.txt:2: the labels are not JSON"),
    ("img/0.png\t{\"transcription\": \"a\"}", "train.txt:2: the labels must be a JSON list"),
    ("img/0.png\t[{\"points\": [[0, 0], [1, 0], [1, 1], [0, 1]]}]", "train.txt:2: label 1 has no \"transcription\""),
    ("img/0.png\t[{\"transcription\": \"a\", \"points\": [[0, 0], [1, 0], [1, 1]]}]",
     "train.txt:2: label 1's \"points\" must be 4 or more [x, y] number pairs"),
    ("img/0.png\t[{\"transcription\": \"a\", \"points\": [[0, 0], [1, 0], [1, \"y\"], [0, 1]]}]",
     "train.txt:2: label 1's \"points\""),
    ("img/9.png\t[]", "train.txt:2: img/9.png: missing or not a decodable image"),
    ("../x.png\t[]", "train.txt:2: ../x.png: outside the data folder"),
])
def test_a_malformed_label_line_is_one_line_naming_file_and_line(tmp_path, line, needle):
    good = _line(1, [{"transcription": "a", "points": [[0, 0], [9, 0], [9, 9], [0, 9]]}])
    root = _folder(tmp_path / "d", {"train.txt": good + "\n" + line + "\n"})
    with pytest.raises(InputError) as e:
        _load(root)
    assert needle in str(e.value) and str(root / "train.txt") in str(e.value) and "\n" not in str(e.value)


def test_label_file_forms_and_a_missing_source(tmp_path):
    """A folder of test.txt only, one label file, several comma-separated (each image path relative to its own
    file's folder), all the test split; a missing file or folder is named."""
    quad = [{"transcription": "a", "points": [[0, 0], [9, 0], [9, 9], [0, 9]]}]
    root = _folder(tmp_path / "d", {"test.txt": _line(0, quad) + "\n" + _line(1, []) + "\n"})
    other = _folder(tmp_path / "e", {"det_gt.txt": _line(5, quad) + "\n"})
    for given, n in ((root, 2), (root / "test.txt", 2), (f"{root / 'test.txt'},{other / 'det_gt.txt'}", 3)):
        d = _load(given)
        assert (len(d.train), len(d.val), len(d.test)) == (0, 0, n), given
    assert d.test.texts == [["a"], [], ["a"]] and d.test.images[2].shape == (100, 205, 3)
    assert d.files == {"test": [str(root / "test.txt"), str(other / "det_gt.txt")]}
    with pytest.raises(InputError, match=r"a folder without a label file: none of train.txt, det_gt_train.txt"):
        _load(_folder(tmp_path / "f", {}))
    with pytest.raises(InputError, match=f"--data {tmp_path / 'nowhere'}: no such file or folder"):
        _load(tmp_path / "nowhere")


@pytest.mark.parametrize("body, needle", [
    (None, "{d}/missing.txt: no such label file"),
    ("\n\n", "{d}/l.txt: no label lines"),
    ("img/9.png\t[]\n", "{d}/l.txt:1: img/9.png: missing or not a decodable image"),
])
def test_a_bad_label_file_in_a_list_is_named(tmp_path, body, needle):
    root = _folder(tmp_path / "d", {"ok.txt": _line(0, []) + "\n", **({} if body is None else {"l.txt": body})})
    with pytest.raises(InputError) as e:
        _load(f"{root / 'ok.txt'},{root / ('missing.txt' if body is None else 'l.txt')}")
    assert needle.format(d=root) in str(e.value) and "\n" not in str(e.value), str(e.value)



# ------------------------------------------------------------------ the contract


def test_settings_from_inference_yml_and_refusals():
    from pipeline import iospec
    from pipeline.nets import paddle_program

    x = iospec.Tensor("x", "float32", (-1, 3, -1, -1))
    det = paddle_program.ProgramIO((x,), (iospec.Tensor("s", "float32", (-1, 1, -1, -1)),), (), frozenset())
    labels, st = ocr_det.from_program(det, None, {"PostProcess": {"name": "DBPostProcess", "box_thresh": "0.5",
                                                                  "unclip_ratio": 2}}, "m")
    assert labels == ["text"] and st["box_thresh"] == 0.5 and st["unclip_ratio"] == 2.0 and st["input"] == "x"
    assert st["system_unclip_ratio"] == ocr_det.settings["system_unclip_ratio"]  # recorded beside the yml's values
    rec = paddle_program.ProgramIO((x,), (iospec.Tensor("p", "float32", (-1, -1, 6625)),), (), frozenset())
    for pio, keys, yml, needle in [
        (rec, None, {}, "m: ocr_det needs a text probability map [N, 1, H, W]; output 'p' is float32 [-1, -1, 6625]"),
        (det, Path("k.txt"), {}, "m: ocr_det reads no key file"),
        (det, None, {"PostProcess": {"score_mode": "median"}}, "m: ocr_det score_mode 'median'"),
        (det, None, {"PostProcess": {"thresh": "high"}}, "m: inference.yml PostProcess.thresh 'high' is not a float"),
        (det, None, {"PostProcess": {"unclip_ratio": 0}}, "m: ocr_det unclip_ratio 0.0: must be above 0"),
    ]:
        with pytest.raises(InputError) as e:
            ocr_det.from_program(pio, keys, yml, "m")
        assert needle in str(e.value) and "\n" not in str(e.value)


def test_check_outputs_fidelity_and_training():
    m = _map()
    m[0, 0, 10:20, 20:80] = 0.9
    ocr_det.check_outputs({"maps": m}, INFO, "m")
    with pytest.raises(InputError, match=r"m: ocr_det needs one float \[N, 1, H, W\] probability map, got float32 \[1, 6\]"):
        ocr_det.check_outputs({"maps": np.zeros((1, 6), np.float32)}, INFO, "m")
    shifted = np.roll(m, 3, axis=3)
    assert ocr_det.fidelity({"maps": m}, {"maps": m}, INFO) == {"box_agreement": 1.0}
    assert ocr_det.fidelity({"maps": shifted}, {"maps": m}, INFO) == {"box_agreement": 0.0}
    with pytest.raises(InputError, match="ocr_det: pipe train does not fine-tune detectors yet"):
        ocr_det.targets(None, None, INFO)


def test_the_task_never_imports_paddle():
    code = ("import sys, numpy as np; from pipeline import tasks; from pipeline.tasks import ocr_det; "
            "info = tasks.Info(('text',), dict(ocr_det.settings)); m = np.zeros((1, 1, 64, 64), 'f4'); "
            "m[0, 0, 5:15, 5:50] = 0.9; split = ocr_det.data_mod.Pages([np.zeros((64, 64, 3), np.uint8)], [[]], [[]]); "
            "list(ocr_det.batches(split, info, 1)); ocr_det.score(ocr_det.decode({'maps': m}, info), split, info); "
            "assert 'paddle' not in sys.modules, 'paddle imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)
