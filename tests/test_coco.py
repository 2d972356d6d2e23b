"""pipeline/tasks/detection/coco.py: the seeded shapes generator, the COCO reader, its cache and its one-line errors."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.tasks.detection import coco
from pipeline.errors import InputError

CATS = [{"id": 1, "name": "rectangle"}, {"id": 2, "name": "ellipse"}, {"id": 3, "name": "triangle"}]


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _cache_files(cache: Path) -> list[Path]:
    return [p for p in cache.rglob("*") if p.is_file()] if cache.exists() else []


def _write(root: Path, split: str, doc: dict, colours: dict[str, tuple[int, int, int]] | None = None) -> None:
    """Write one split file and a flat-colour PNG of the declared size for each of its images."""
    (root / "annotations").mkdir(parents=True, exist_ok=True)
    (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))
    for im in doc["images"]:
        path = root / "images" / im["file_name"]
        path.parent.mkdir(parents=True, exist_ok=True)
        colour = (colours or {}).get(im["file_name"], (90, 120, 150))
        Image.new("RGB", (im["width"], im["height"]), colour).save(path)


def _doc(w: int = 64, h: int = 64) -> dict:
    """A valid two-image train file: image 5 (annotation 17), image 6 (annotations 18, 19)."""
    return {
        "images": [{"id": 5, "file_name": "a.png", "width": w, "height": h},
                   {"id": 6, "file_name": "sub/b.png", "width": w, "height": h}],
        "annotations": [
            {"id": 17, "image_id": 5, "category_id": 1, "bbox": [2, 3, 10, 12], "area": 120, "iscrowd": 0},
            {"id": 18, "image_id": 6, "category_id": 2, "bbox": [0, 0, w, h], "area": w * h, "iscrowd": 0},
            {"id": 19, "image_id": 6, "category_id": 3, "bbox": [1.5, 2.25, 4, 5.5], "area": 22, "iscrowd": 0},
        ],
        "categories": copy.deepcopy(CATS),
    }


# ---------------------------------------------------------------- generate


def test_generate_is_deterministic_and_atomic(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    coco.generate(a, (12, 4, 4), 64, seed=3)
    coco.generate(b, (12, 4, 4), 64, seed=3)
    coco.generate(c, (12, 4, 4), 64, seed=4)
    files = _files(a)
    assert files == _files(b)
    assert files != _files(c)
    assert sum(name.endswith(".png") for name in files) == 20
    assert {"annotations/instances_train.json", "annotations/instances_val.json",
            "annotations/instances_test.json", "shapes.json"} <= set(files)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no .tmp-<pid> left
    mtime = (a / "images" / "train" / "000000.png").stat().st_mtime_ns
    coco.generate(a, (12, 4, 4), 64, seed=3)  # complete: left alone
    assert (a / "images" / "train" / "000000.png").stat().st_mtime_ns == mtime
    with pytest.raises(InputError, match=r"is not a shapes dataset with counts=\[12, 4, 4\], size=64, seed=5"):
        coco.generate(a, (12, 4, 4), 64, seed=5)
    assert _files(a) == files


def test_generate_interrupted_leaves_nothing(tmp_path, monkeypatch):
    real, calls = coco._shapes_image, []

    def flaky(rng, s):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("killed")
        return real(rng, s)

    monkeypatch.setattr(coco, "_shapes_image", flaky)
    with pytest.raises(RuntimeError):
        coco.generate(tmp_path / "d", (12, 0, 0), 64)
    assert list(tmp_path.iterdir()) == []


def test_generate_boxes_are_tight_disjoint_and_in_bounds(tmp_path):
    root = tmp_path / "shapes"
    coco.generate(root, (12, 4, 4), 64, seed=0)
    assert not (root / "annotations" / "instances_none.json").exists()
    classes = set()
    for split in ("train", "val", "test"):
        doc = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
        assert doc["categories"] == CATS
        for im in doc["images"]:
            anns = [a for a in doc["annotations"] if a["image_id"] == im["id"]]
            assert 1 <= len(anns) <= 4
            pixels = np.asarray(Image.open(root / "images" / im["file_name"]).convert("RGB"), np.float64)
            assert pixels.shape == (64, 64, 3)
            boxes = [a["bbox"] for a in anns]
            for i, (x, y, w, h) in enumerate(boxes):
                assert x >= 0 and y >= 0 and x + w <= 64 and y + h <= 64 and 4 <= min(w, h) and max(w, h) <= 32
                for x2, y2, w2, h2 in boxes[i + 1:]:
                    assert x + w <= x2 or x2 + w2 <= x or y + h <= y2 or y2 + h2 <= y, (im, boxes)
                cy, cx = y + h // 2, x + w // 2
                colour = np.median(pixels[cy - 1:cy + 2, cx - 1:cx + 2].reshape(-1, 3), 0)
                obj = np.sqrt(((pixels - colour) ** 2).sum(-1)) < 40
                # tight: the object reaches all four edges of its box ...
                assert obj[y, x:x + w].any() and obj[y + h - 1, x:x + w].any(), (im, x, y, w, h)
                assert obj[y:y + h, x].any() and obj[y:y + h, x + w - 1].any(), (im, x, y, w, h)
                # ... and nothing of it lies in the one-pixel ring around the box
                ring = np.zeros((66, 66), bool)
                ring[y:y + h + 2, x:x + w + 2] = True
                ring[y + 1:y + h + 1, x + 1:x + w + 1] = False
                assert not (np.pad(obj, 1) & ring).any(), (im, x, y, w, h)
            classes |= {a["category_id"] for a in anns}
    assert classes == {1, 2, 3}


def test_generate_then_read_round_trips(tmp_path):
    root, cache = tmp_path / "shapes", tmp_path / "cache"
    coco.generate(root, (12, 4, 4), 64, seed=1)
    d = coco.read(root, 64, cache)
    assert d.labels == ("rectangle", "ellipse", "triangle") and d.category_ids == (1, 2, 3)
    assert d.images.shape == (20, 3, 64, 64) and d.images.dtype == np.uint8
    assert d.split.tolist() == [0] * 12 + [1] * 4 + [2] * 4 and d.split.dtype == np.uint8
    assert d.sizes.tolist() == [[64, 64]] * 20
    assert d.boxes.dtype == np.float32 and d.boxes.shape[2] == 5
    n = 0
    for k, split in enumerate(("train", "val", "test")):
        doc = json.loads((root / "annotations" / f"instances_{split}.json").read_text())
        for im in doc["images"]:
            assert d.files[n] == im["file_name"]
            want = [[x, y, x + w, y + h, a["category_id"] - 1] for a in doc["annotations"]
                    if a["image_id"] == im["id"] for x, y, w, h in [a["bbox"]]]
            got = d.boxes[n]
            np.testing.assert_allclose(got[:len(want)], want, atol=1e-5)
            assert (got[len(want):, 4] == -1).all() and (got[len(want):, :4] == 0).all()
            pil = np.asarray(Image.open(root / "images" / im["file_name"]).convert("RGB")).transpose(2, 0, 1)
            assert np.array_equal(d.images[n], pil)
            n += 1
    assert n == 20 and d.boxes.shape[1] == max((b[:, 4] >= 0).sum() for b in d.boxes)
    assert len(_cache_files(cache)) == 1


# ---------------------------------------------------------------- read


def test_resize_scales_boxes_and_keeps_sizes(tmp_path):
    root = tmp_path / "r"
    doc = _doc(w=48, h=32)
    doc["annotations"][0]["bbox"] = [6, 4, 12, 8]
    _write(root, "train", doc, {"a.png": (200, 10, 30)})
    d = coco.read(root, 64, tmp_path / "cache")
    assert d.images.shape == (2, 3, 64, 64)
    assert d.sizes.tolist() == [[32, 48], [32, 48]]
    np.testing.assert_allclose(d.boxes[0, 0], [8, 8, 24, 24, 0], atol=1e-5)  # x * 64/48, y * 64/32
    np.testing.assert_allclose(d.boxes[1, :2], [[0, 0, 64, 64, 1], [2, 4.5, 7.3333333, 15.5, 2]], atol=1e-5)
    assert (d.images[0].reshape(3, -1).T == (200, 10, 30)).all()
    kept = coco.read(root, 0, tmp_path / "cache")
    assert kept.images.shape == (2, 3, 32, 48)
    np.testing.assert_allclose(kept.boxes[0, 0], [6, 4, 18, 12, 0])


def test_size_zero_needs_one_image_size(tmp_path):
    root = tmp_path / "mixed"
    doc = _doc()
    doc["images"][1].update(width=48, height=32)
    doc["annotations"][1]["bbox"] = [0, 0, 48, 32]
    _write(root, "train", doc)
    with pytest.raises(InputError, match=r"images/a.png is 64x64, images/sub/b.png is 48x32\); set data.image_size"):
        coco.read(root, 0, tmp_path / "cache")
    assert _cache_files(tmp_path / "cache") == []
    assert coco.read(root, 16, tmp_path / "cache").images.shape == (2, 3, 16, 16)


def test_category_ids_map_to_class_indices_in_id_order(tmp_path):
    root = tmp_path / "ids"
    doc = _doc()
    doc["categories"] = [{"id": 12, "name": "dog"}, {"id": 7, "name": "cat"}]
    for a, cat in zip(doc["annotations"], (12, 7, 12)):
        a["category_id"] = cat
    _write(root, "train", doc)
    d = coco.read(root, 64, tmp_path / "cache")
    assert d.labels == ("cat", "dog") and d.category_ids == (7, 12)
    assert d.boxes[0, 0, 4] == 1 and d.boxes[1, :, 4].tolist() == [0, 1]


def test_crowd_dropped_empty_images_and_missing_splits(tmp_path):
    root = tmp_path / "crowd"
    doc = _doc()
    doc["images"].append({"id": 8, "file_name": "empty.png", "width": 64, "height": 64})
    doc["annotations"][0]["iscrowd"] = 1
    del doc["annotations"][2]["iscrowd"]  # absent means 0
    _write(root, "train", doc)
    d = coco.read(root, 64, tmp_path / "cache")
    assert d.split.tolist() == [0, 0, 0]  # no val/test file: nothing invented
    assert d.boxes.shape == (3, 2, 5)
    assert d.boxes[0, :, 4].tolist() == [-1, -1] and not d.boxes[0, :, :4].any()  # only a crowd box
    assert d.boxes[1, :, 4].tolist() == [1, 2]
    assert d.boxes[2, :, 4].tolist() == [-1, -1]
    val = {"images": [{"id": 5, "file_name": "v.png", "width": 64, "height": 64}], "annotations": [],
           "categories": copy.deepcopy(CATS)}  # image ids may repeat across split files
    _write(root, "val", val)
    d = coco.read(root, 64, tmp_path / "cache")
    assert d.split.tolist() == [0, 0, 0, 1] and d.files[3] == "v.png"


def test_no_annotations_at_all_gives_one_padding_row(tmp_path):
    root = tmp_path / "bare"
    doc = _doc()
    doc["annotations"] = []
    _write(root, "train", doc)
    d = coco.read(root, 64, None)
    assert d.boxes.shape == (2, 1, 5) and (d.boxes[..., 4] == -1).all()


def test_cache_is_content_keyed_and_reused(tmp_path, monkeypatch):
    root, cache = tmp_path / "c", tmp_path / "cache"
    _write(root, "train", _doc(), {"a.png": (10, 20, 30)})
    first = coco.read(root, 32, cache)
    assert len(_cache_files(cache)) == 1
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)

    def no_decode(*args):
        raise AssertionError("decoded although cached")

    with monkeypatch.context() as m:
        m.setattr(coco, "_decode", no_decode)
        again = coco.read(moved, 32, cache)  # same bytes elsewhere: same cache entry
    assert np.array_equal(first.images, again.images) and np.array_equal(first.boxes, again.boxes)
    Image.new("RGB", (64, 64), (1, 2, 3)).save(moved / "images" / "a.png")
    changed = coco.read(moved, 32, cache)
    assert (changed.images[0].reshape(3, -1).T == (1, 2, 3)).all()
    coco.read(moved, 16, cache)
    assert len(_cache_files(cache)) == 3  # new image bytes, new image_size: new keys


# ---------------------------------------------------------------- validation


def _ann(doc, i=0):
    return doc["annotations"][i]


BAD = {
    # wholly outside, past the right edge and above the top; a box merely past an edge is clipped (below)
    "box_outside": (lambda d, r: _ann(d).update(bbox=[64.01, 2, 10, 5]),
                    "annotation 17: box [64.01, 2, 10, 5] lies outside image 5 (64x64)"),
    "box_outside_above": (lambda d, r: _ann(d).update(bbox=[2, -12, 10, 11.5]),
                          "annotation 17: box [2, -12, 10, 11.5] lies outside image 5 (64x64)"),
    "box_negative_width": (lambda d, r: _ann(d).update(bbox=[20, 2, -3, 5]),
                           "annotation 17: box [20, 2, -3, 5] has a negative size (w and h must be >= 0)"),
    "box_negative_height": (lambda d, r: _ann(d).update(bbox=[2, 20, 3, -0.5]),
                            "annotation 17: box [2, 20, 3, -0.5] has a negative size (w and h must be >= 0)"),
    "box_nan": (lambda d, r: _ann(d).update(bbox=[2, 2, float("nan"), 5]),
                'annotation 17: "bbox" must be 4 finite numbers [x, y, w, h], got [2, 2, NaN, 5]'),
    "box_not_numbers": (lambda d, r: _ann(d).update(bbox=[2, 2, "5", 5]),
                        'annotation 17: "bbox" must be 4 finite numbers [x, y, w, h], got [2, 2, "5", 5]'),
    "unknown_category": (lambda d, r: _ann(d).update(category_id=9),
                         "annotation 17: unknown category_id 9 (categories: 1, 2, 3)"),
    "unknown_image": (lambda d, r: _ann(d).update(image_id=99), "annotation 17: image_id 99 is not in images"),
    "bad_crowd": (lambda d, r: _ann(d).update(iscrowd=2), 'annotation 17: "iscrowd" must be 0 or 1, got 2'),
    "missing_bbox": (lambda d, r: _ann(d).pop("bbox"), 'annotation 17: missing "bbox"'),
    "missing_ann_id": (lambda d, r: _ann(d, 1).pop("id"), 'annotations[1]: missing "id"'),
    "missing_width": (lambda d, r: d["images"][0].pop("width"), 'image 5: missing "width"'),
    "missing_key": (lambda d, r: d.pop("categories"),
                    'missing "categories" (a COCO file has images, annotations and categories)'),
    "no_categories": (lambda d, r: d.update(categories=[]), "no categories"),
    "duplicate_image": (lambda d, r: d["images"][1].update(id=5), "image id 5 appears twice"),
    "duplicate_annotation": (lambda d, r: _ann(d, 2).update(id=17), "annotation id 17 appears twice"),
    "duplicate_category": (lambda d, r: d["categories"][2].update(id=1), "category id 1 appears twice"),
    "duplicate_file": (lambda d, r: d["images"][1].update(file_name="a.png"), "image 6: images/a.png is also image 5"),
    "escaping_file": (lambda d, r: d["images"][0].update(file_name="../a.png"),
                      'image 5: "file_name" "../a.png" must be a relative path inside images/'),
    "missing_image": (lambda d, r: (r / "images" / "a.png").unlink(),
                      "image 5 (annotation 17): images/a.png is missing"),
    "unreadable_image": (lambda d, r: (r / "images" / "a.png").write_bytes(b"not a png"),
                         "image 5 (annotation 17): images/a.png is not a readable PNG/JPEG image"),
    "wrong_size": (lambda d, r: Image.new("RGB", (40, 32)).save(r / "images" / "a.png"),
                   "image 5 (annotation 17): images/a.png is 40x32, the file says 64x64"),
    "truncated_image": (lambda d, r: (r / "images" / "sub" / "b.png").write_bytes(
                            (r / "images" / "sub" / "b.png").read_bytes()[:60]),
                        "image 6 (annotation 18): images/sub/b.png is not a readable PNG/JPEG image"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_folder_names_file_and_id_and_writes_nothing(tmp_path, case):
    mutate, fragment = BAD[case]
    root, cache = tmp_path / "bad", tmp_path / "cache"
    _write(root, "train", _doc())
    # a valid read first: proves the cache directory is where entries would go
    coco.read(root, 32, tmp_path / "ok-cache")
    assert len(_cache_files(tmp_path / "ok-cache")) == 1
    doc = _doc()
    mutate(doc, root)
    (root / "annotations" / "instances_train.json").write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        coco.read(root, 32, cache)
    msg = str(e.value)
    assert msg.startswith(f"data.source {root / 'annotations' / 'instances_train.json'}: ")
    assert fragment in msg and "\n" not in msg, msg
    assert _cache_files(cache) == []


def test_box_touching_the_edge_within_tolerance_is_fine(tmp_path):
    root = tmp_path / "edge"
    doc = _doc()
    doc["annotations"][0]["bbox"] = [54, -0.0005, 10, 64.0009]
    _write(root, "train", doc)
    d = coco.read(root, 64, None)
    np.testing.assert_allclose(d.boxes[0, 0], [54, 0, 64, 64, 0], atol=1e-5)
    assert (d.clipped, d.dropped, d.note) == (0, 0, "")  # round-off is not a box past the edge


def _past_the_edge(root: Path) -> None:
    """Issue 51.5's box (annotation 6 [44, 18, 59, 59] of image 6, 96x96, reaches x = 103), one past the
    top-left corner (both clipped), one touching the right edge from outside and one of width 0 (no area:
    dropped), and two plain boxes; three images, so that val and test can be carved out of train."""
    doc = {"images": [{"id": i, "file_name": f"{i}.png", "width": 96, "height": 96} for i in (6, 7, 8)],
           "annotations": [
               {"id": 6, "image_id": 6, "category_id": 1, "bbox": [44, 18, 59, 59]},
               {"id": 7, "image_id": 6, "category_id": 2, "bbox": [-2.5, -4, 10, 12]},
               {"id": 8, "image_id": 7, "category_id": 3, "bbox": [96, 30, 5, 5]},
               {"id": 9, "image_id": 7, "category_id": 1, "bbox": [10, 30, 0, 5]},
               {"id": 10, "image_id": 7, "category_id": 2, "bbox": [3, 4, 20, 30]},
               {"id": 11, "image_id": 8, "category_id": 3, "bbox": [50, 60, 16, 8]}],
           "categories": copy.deepcopy(CATS)}
    _write(root, "train", doc)


# what the reader keeps, per image: [x1, y1, x2, y2, class index]; -1 rows pad
CLIPPED = [[[44, 18, 96, 77, 0], [0, 0, 7.5, 8, 1]],
           [[3, 4, 23, 34, 1], [0, 0, 0, 0, -1]],
           [[50, 60, 66, 68, 2], [0, 0, 0, 0, -1]]]


def _note(root: Path) -> str:
    return (f"data.source {root}: 2 boxes past the image edge clipped to it (first: annotations/instances_train.json "
            "annotation 6, [44, 18, 59, 59] in image 6 (96x96) -> [44, 18, 52, 59]); 2 boxes with no area after "
            "clipping dropped (first: annotations/instances_train.json annotation 8, [96, 30, 5, 5] in image 7 (96x96))")


def test_a_box_past_the_edge_is_clipped_and_one_left_with_no_area_dropped(tmp_path):
    root = tmp_path / "edge"
    _past_the_edge(root)
    d = coco.read(root, 0, None)
    assert d.boxes.tolist() == CLIPPED
    assert (d.clipped, d.dropped) == (2, 2) and d.note == _note(root)
    half = coco.read(root, 48, None)  # resized: the clipped box scales with the image
    assert half.boxes[0, 0].tolist() == [22, 9, 48, 38.5, 0] and half.note == d.note


def test_the_eval_ground_truth_is_the_clipped_one(tmp_path):
    """COCO mAP (pycocotools, as training and export judge a split) scores detections on the clipped boxes
    exactly 1.0, and the file's own box past the edge below 1: the dropped boxes are not missed objects and the
    clipped one is judged clipped. data.load hands every split the same clipped rows."""
    from pipeline import data as data_mod
    from pipeline.config import DataConfig
    from pipeline.tasks import detection

    root = tmp_path / "edge"
    _past_the_edge(root)
    ds = data_mod.load(DataConfig(source=str(root), image_size=0, cache_dir=str(tmp_path / "c"), val_fraction=0.34,
                                  test_fraction=0.34), "boxes")
    assert ds.counts == {"boxes_clipped": 2, "boxes_dropped": 2} and ds.notes == (_note(root),)
    for split in (ds.train, ds.val, ds.test):
        assert len(split) == 1
        y = np.asarray(split.y[split.idx])
        truth = np.array(CLIPPED[int(split.idx[0])], np.float32)
        assert np.array_equal(y[0], truth)
        real = truth[truth[:, 4] >= 0]
        dets = [np.c_[real[:, :4], np.ones(len(real)), real[:, 4]].astype(np.float32)]
        assert detection.coco_map(dets, y, 3) == pytest.approx({"map": 1.0, "map50": 1.0}, abs=1e-9)
    unclipped = np.array([[44, 18, 103, 77, 1, 0], [-2.5, -4, 7.5, 8, 1, 1]], np.float32)  # x + w, y + h as given
    scores = detection.coco_map([unclipped], np.array([CLIPPED[0]], np.float32), 3)
    assert scores["map50"] == pytest.approx(1.0, abs=1e-9) and scores["map"] < 0.9  # IoU 52/59 with the clipped box: missed above .85


@pytest.mark.slow  # trains one epoch: 12 s on the shared 2-core machine, paddle import included
def test_pipe_train_prints_one_note_and_counts_them_in_the_manifest(cli, tmp_path):
    root = tmp_path / "edge"
    _past_the_edge(root)
    run = tmp_path / "run"
    config = Path(__file__).resolve().parents[1] / "examples" / "detection.yaml"
    code, out, err = cli("train", "--config", config, "--set", f"data.source={root}", "--set", "data.image_size=0",
                         "--set", "data.val_fraction=0.34", "--set", "data.test_fraction=0.34",
                         "--set", f"data.cache_dir={tmp_path / 'c'}", "--set", "train.batch_size=1",
                         "--set", "train.warmup_epochs=0", "--run", run, "--epochs", "1")
    assert code == 0, err[-2000:]
    notes = [line for line in (out + err).splitlines() if line.startswith("note: data.source")]
    assert notes == [f"note: {_note(root)}"]
    m = json.loads((run / "train" / "manifest.json").read_text())
    assert m["data"] == {"boxes_clipped": 2, "boxes_dropped": 2, "notes": [_note(root)]}


def test_malformed_json_names_the_file(tmp_path):
    root = tmp_path / "j"
    _write(root, "train", _doc())
    _write(root, "val", _doc())
    (root / "annotations" / "instances_val.json").write_text('{"images": [')
    with pytest.raises(InputError, match=r"instances_val.json: not valid JSON \(Expecting value at line 1 column 13\)"):
        coco.read(root, 32, tmp_path / "cache")
    (root / "annotations" / "instances_val.json").write_text("[]")
    with pytest.raises(InputError, match=r"instances_val.json: top level is not an object"):
        coco.read(root, 32, tmp_path / "cache")
    assert _cache_files(tmp_path / "cache") == []


def test_errors_in_val_and_test_name_their_file(tmp_path):
    root = tmp_path / "v"
    _write(root, "train", _doc())
    val = {"images": [{"id": 1, "file_name": "v.png", "width": 64, "height": 64}],
           "annotations": [{"id": 3, "image_id": 1, "category_id": 1, "bbox": [0, 70, 65, 5]}],
           "categories": copy.deepcopy(CATS)}
    _write(root, "val", val)
    with pytest.raises(InputError, match=r"instances_val.json: annotation 3: box \[0, 70, 65, 5\] lies outside image 1"):
        coco.read(root, 32, None)
    val["annotations"] = []
    _write(root, "val", val)
    test = {"images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 64}], "annotations": [],
            "categories": copy.deepcopy(CATS)}
    _write(root, "test", test)
    with pytest.raises(InputError, match=r"instances_test.json: image 1: images/a.png is also image 5 of "
                                         r"instances_train.json"):
        coco.read(root, 32, None)
    test["images"][0]["file_name"] = "t.png"
    test["categories"][1]["name"] = "circle"
    _write(root, "test", test)
    with pytest.raises(InputError, match=r"instances_test.json: categories \(1 rectangle, 2 circle, 3 triangle\) "
                                         r"differ from .*train.json.s \(1 rectangle, 2 ellipse, 3 triangle\)"):
        coco.read(root, 32, None)
    test["categories"] = [{"id": 1, "name": "rectangle"}, {"id": 2, "name": "ellipse"}]
    _write(root, "test", test)
    with pytest.raises(InputError, match=r"instances_test.json: categories"):
        coco.read(root, 32, None)


def test_no_train_file(tmp_path):
    root = tmp_path / "empty"
    (root / "images").mkdir(parents=True)
    with pytest.raises(InputError) as e:
        coco.read(root, 32, tmp_path / "cache")
    assert str(e.value) == (f"data.source {root}: no COCO train annotations found; looked for a COCO folder: "
                            "annotations/instances_{train,val,test}.json + images/; or COCO 2017: "
                            "annotations/instances_{train,val}2017.json + train2017/, val2017/; or Roboflow: "
                            "{train,valid,test}/_annotations.coco.json beside the images; or a json beside each split "
                            "folder: {train,val,test}.json + {train,val,test}/; or data.coco_{train,val,test}_json/_images")
    _write(root, "val", _doc())  # val alone is not enough
    with pytest.raises(InputError, match="no COCO train annotations found"):
        coco.read(root, 32, tmp_path / "cache")
    assert _cache_files(tmp_path / "cache") == []


# ---------------------------------------------------------------- the layouts people have (issue 31.2)

EXPLICIT = {"train": ("labels/tr.json", "pix/a"), "val": ("labels/va.json", "pix/b"), "test": ("labels/te.json", "pix/c")}


def _relayout(src: Path, dest: Path, kind: str) -> Path:
    """The same COCO data (annotations/instances_{train,val}.json + images/) moved into another layout."""
    moves = {"coco2017": {"train": ("annotations/instances_train2017.json", "train2017"),
                          "val": ("annotations/instances_val2017.json", "val2017"),
                          "test": ("annotations/instances_test2017.json", "test2017")},
             "roboflow": {"train": ("train/_annotations.coco.json", "train"), "val": ("valid/_annotations.coco.json", "valid"),
                          "test": ("test/_annotations.coco.json", "test")},
             "beside": {"train": ("train.json", "train"), "val": ("val.json", "val"), "test": ("test.json", "test")},
             "explicit": EXPLICIT}[kind]
    for split, (ann, folder) in moves.items():
        if not (src / "annotations" / f"instances_{split}.json").is_file():
            continue
        doc = json.loads((src / "annotations" / f"instances_{split}.json").read_text())
        (dest / ann).parent.mkdir(parents=True, exist_ok=True)
        (dest / ann).write_text(json.dumps(doc))
        (dest / folder).mkdir(parents=True, exist_ok=True)
        for im in doc["images"]:
            (dest / folder / im["file_name"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / "images" / im["file_name"], dest / folder / im["file_name"])
    return dest


def _two_splits(root: Path) -> Path:
    _write(root, "train", _doc(), {"a.png": (200, 10, 10), "b.png": (10, 200, 10)})
    val = _doc()
    for im in val["images"]:
        im["file_name"] = "v" + im["file_name"]
    _write(root, "val", val, {"va.png": (10, 10, 200)})
    return root


def test_explicit_paths_that_do_not_exist_name_the_key(tmp_path):
    root = _two_splits(tmp_path / "d")
    with pytest.raises(InputError, match=r"data.coco_val_json .*nope.json: no such file"):
        coco.read(root, 32, None, {"train": ("annotations/instances_train.json", "images"), "val": ("nope.json", "images")})


def _split_doc(split: str, n: int) -> tuple[dict, dict[str, tuple[int, int, int]]]:
    """n 16x16 images of one split, each a flat colour unique to (split, index), with one or two boxes."""
    k = _SPLIT_NAMES.index(split)
    doc = {"images": [], "annotations": [], "categories": copy.deepcopy(CATS)}
    colours = {}
    for i in range(n):
        name = f"{split}{i}.png"
        doc["images"].append({"id": 100 + i, "file_name": name, "width": 16, "height": 16})
        colours[name] = (20 + 70 * k, 10 + 20 * i, 200 - 20 * i)
        for j in range(1 + i % 2):
            doc["annotations"].append({"id": 1000 + 10 * i + j, "image_id": 100 + i, "category_id": 1 + (i + j) % 3,
                                       "bbox": [1 + j, 2, 5 + i, 6 + j], "area": 30, "iscrowd": 0})
    return doc, colours


_SPLIT_NAMES = ("train", "val", "test")


@pytest.mark.parametrize("splits", [("train",), ("train", "val"), ("train", "val", "test")])
@pytest.mark.parametrize("kind", ["coco2017", "roboflow", "beside", "explicit"])
def test_every_layout_loads_what_today_s_layout_loads(tmp_path, kind, splits):
    """The same COCO data in each layout gives data.load's images, boxes, sizes and train/val/test positions of
    annotations/ + images/, for a detection task and for a stage that does not say; a split without its
    annotation file is carved out of train exactly as before."""
    from pipeline import config as config_mod, data as data_mod

    ref = tmp_path / "ref"
    for split, n in zip(splits, (6, 3, 2)):
        _write(ref, split, *_split_doc(split, n))
    root = _relayout(ref, tmp_path / kind, kind)
    sets = [f"data.cache_dir={tmp_path / 'cache'}", "data.val_fraction=0.34", "data.test_fraction=0.34"]
    keys = [f"data.coco_{s}_{k}={v}" for s in splits for k, v in zip(("json", "images"), EXPLICIT[s])]
    want = data_mod.load(config_mod.load(None, [f"data.source={ref}", *sets]).data, "boxes")
    cfg = config_mod.load(None, [f"data.source={root}", *sets, *(keys if kind == "explicit" else [])]).data
    for targets in ("boxes", None):  # pipe train passes the task's; compress, report, bench do not
        got = data_mod.load(cfg, targets)
        assert got.targets == "boxes" and got.labels == want.labels and np.array_equal(got.sizes, want.sizes)
        for name in _SPLIT_NAMES:
            a, b = getattr(want, name), getattr(got, name)
            assert np.array_equal(a.idx, b.idx) and len(b) > 0
            assert np.array_equal(a.rows(np.arange(len(a)))["image"], b.rows(np.arange(len(b)))["image"])
            assert np.array_equal(a.y[a.idx], b.y[b.idx])


def test_the_issue_s_folder_loads_and_pipe_train_refuses_class_folders_in_one_line(cli, tmp_path):
    """Issue 31.2's folder (train/ + train.json, val/ + val.json, no test) reads as detection data; `pipe train` with
    a detection config on a class-folder tree exits 2 with one line naming the folder and the layouts looked for."""
    from pipeline import config as config_mod, data as data_mod

    ref = tmp_path / "ref"
    _write(ref, "train", *_split_doc("train", 6))
    _write(ref, "val", *_split_doc("val", 2))
    root = _relayout(ref, tmp_path / "mine", "beside")
    assert sorted(p.name for p in root.iterdir()) == ["train", "train.json", "val", "val.json"]
    ds = data_mod.load(config_mod.load(None, [f"data.source={root}", f"data.cache_dir={tmp_path / 'c'}",
                                              "data.test_fraction=0.34"]).data, "boxes")
    assert (len(ds.train), len(ds.val), len(ds.test)) == (4, 2, 2)
    classes = tmp_path / "classes"
    for c in ("cat", "dog"):
        for i in range(2):
            (classes / c).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (16, 16), (40 * i, 90, 9)).save(classes / c / f"{i}.png")
    run = tmp_path / "run"
    config = Path(__file__).resolve().parents[1] / "examples" / "detection.yaml"
    code, _, err = cli("train", "--config", config, "--set", f"data.source={classes}",
                       "--set", f"data.cache_dir={tmp_path / 'c'}", "--run", str(run), "--epochs", "1")
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [f"pipe train: error: data.source {classes}: no COCO train annotations found; "
                                        f"looked for {coco._LAYOUT}"]
    for layout in ("annotations/instances_{train,val,test}.json + images/", "train2017/", "Roboflow",
                   "{train,val,test}.json + {train,val,test}/", "data.coco_{train,val,test}_json"):
        assert layout in err
    assert not (run / "train").exists()


@pytest.mark.parametrize("keys, message", [
    ({"val": ("annotations/instances_val.json", "images")},
     "data.coco_val_json annotations/instances_val.json: needs data.coco_train_json too"),
    ({"train": ("annotations/instances_train.json", "images"), "val": ("", "images")},
     "data.coco_val_images images: needs data.coco_val_json"),
    ({"train": ("annotations/instances_train.json", "nowhere")}, "data.coco_train_images {root}/nowhere: no such folder"),
])
def test_explicit_paths_given_by_half_are_refused_not_ignored(tmp_path, keys, message):
    """Today's main ignored a val file without a train file, and an image folder without its file, silently."""
    from pipeline import config as config_mod, data as data_mod

    root = _two_splits(tmp_path / "d")
    sets = [f"data.coco_{s}_{k}={v}" for s, pair in keys.items() for k, v in zip(("json", "images"), pair) if v]
    cfg = config_mod.load(None, [f"data.source={root}", f"data.cache_dir={tmp_path / 'c'}", *sets]).data
    for targets in ("boxes", None):
        with pytest.raises(InputError) as e:
            data_mod.load(cfg, targets)
        assert str(e.value).startswith(message.format(root=root)) and e.value.exit_code == 2
    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.zeros((4, 1, 8, 8), np.uint8), y=np.arange(4) % 2)
    cfg = config_mod.load(None, [f"data.source={npz}", "data.coco_train_json=a.json"]).data
    with pytest.raises(InputError, match=rf"^data.coco_train_json: names a file of a COCO folder, but data.source "
                                         rf"'{npz}' is not a folder$"):
        data_mod.load(cfg)


def test_a_layout_whose_image_folder_is_missing_names_it(tmp_path):
    """COCO 2017's annotations downloaded without val2017/: one line naming the folder, not one per image."""
    root = _relayout(_two_splits(tmp_path / "ref"), tmp_path / "c17", "coco2017")
    shutil.rmtree(root / "val2017")
    with pytest.raises(InputError) as e:
        coco.read(root, 32, None)
    assert str(e.value) == (f"data.source {root / 'val2017'}: no such folder (the images of "
                            "annotations/instances_val2017.json)")


def test_explicit_paths_outside_the_source_are_in_pipe_all_s_fingerprint(tmp_path):
    """`pipe all` reuses a train step whose inputs' fingerprint is unchanged: an annotation file given by an
    absolute path outside data.source is one of them."""
    from pipeline import config as config_mod
    from stages import all_ as orchestrate

    root = _two_splits(tmp_path / "d")
    outside = tmp_path / "elsewhere.json"
    shutil.copyfile(root / "annotations" / "instances_train.json", outside)
    sets = [f"data.source={root}", f"data.coco_train_json={outside}", "data.coco_train_images=images"]
    before = orchestrate._fingerprints(config_mod.load(None, sets))
    assert set(before) == {"data", "model", "data.coco_train_json"}  # images/ is inside data.source
    outside.write_text(outside.read_text() + " ")
    assert orchestrate._fingerprints(config_mod.load(None, sets))["data.coco_train_json"] != before["data.coco_train_json"]
