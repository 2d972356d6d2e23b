"""ocr_cls's contract against upstream's definitions (PaddleOCR's / RapidOCR's cls resize_norm_img at 3,48,192,
ClsPostProcess, predict_cls's turn rule at cls_thresh, ClsMetric, cls label files) on hand-made cases, and its
generated lines. The real classifier through all of it: tests/stages/test_import_ocr_cls.py."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import config as config_mod, iospec, tasks
from pipeline.errors import InputError
from pipeline.nets import paddle_program
from pipeline.tasks import ocr_cls
from pipeline.tasks.ocr_cls import data
from pipeline.tasks.ocr_rec import data as rec_data

INFO = tasks.Info(ocr_cls.LABELS, {**ocr_cls.settings, "input": "x"})


def _paddleocr_cls_resize_norm_img(bgr: np.ndarray) -> np.ndarray:
    """PaddleOCR's predict_cls / RapidOCR's TextClassifier.resize_norm_img at cls_image_shape 3,48,192, as a
    reference."""
    import cv2

    h, w = bgr.shape[:2]
    ratio = w / float(h)
    resized_w = 192 if math.ceil(48 * ratio) > 192 else int(math.ceil(48 * ratio))
    x = cv2.resize(bgr, (resized_w, 48)).astype("float32").transpose((2, 0, 1)) / 255
    x -= 0.5
    x /= 0.5
    out = np.zeros((3, 48, 192), np.float32)
    out[:, :, :resized_w] = x
    return out


def _probs(rows: list[tuple[int, float]]) -> np.ndarray:
    """[N, 2] with probability p on each row's class."""
    out = np.zeros((len(rows), 2), np.float32)
    for n, (k, p) in enumerate(rows):
        out[n, k], out[n, 1 - k] = p, 1 - p
    return out


# ------------------------------------------------------------------ pre-processing


@pytest.mark.parametrize("hw", [(32, 100), (48, 192), (49, 100), (24, 1000), (60, 7), (500, 3), (40, 190)])
def test_prepare_and_collate_equal_paddleocrs_cls_resize_on_bgr(hw):
    rgb = np.random.default_rng(sum(hw)).integers(0, 256, (*hw, 3), dtype=np.uint8)
    got = ocr_cls.collate([ocr_cls.prepare(rgb)])[0]
    np.testing.assert_array_equal(got, _paddleocr_cls_resize_norm_img(np.ascontiguousarray(rgb[:, :, ::-1])))


def test_the_channel_order_is_bgr_and_padding_is_zero():
    """A red RGB line is (0, 0, 255) in BGR, as cv2.imread gives PaddleOCR: channel 2 is +1, channels 0 and 1 -1;
    a 48 x 96 line fills 96 columns and the other 96 are 0."""
    img = np.zeros((48, 96, 3), np.uint8)
    img[..., 0] = 255
    x = ocr_cls.collate([ocr_cls.prepare(img)])[0]
    assert x.shape == (3, 48, 192)
    assert (x[2, :, :96] == 1).all() and (x[:2, :, :96] == -1).all() and (x[:, :, 96:] == 0).all()


def test_batches_and_prepared_images_are_one_shape_in_batches_of_size():
    widths = [700, 60, 300, 100, 2000, 50, 150]
    split = data.Lines([np.full((40, w, 3), 200, np.uint8) for w in widths], ["0"] * len(widths))
    got = list(ocr_cls.batches(split, INFO, 3))
    assert [len(p) for p, _ in got] == [3, 3, 1] and sorted(i for p, _ in got for i in p) == list(range(7))
    assert [p for p, _ in got][0] == [5, 1, 3]  # narrowest first, as PaddleOCR sorts by aspect ratio
    assert {f["x"].shape[1:] for _, f in got} == {(3, 48, 192)}
    assert [p for p, _ in ocr_cls.batches(split, INFO, 8, rows=[2, 1])] == [[1, 2]]
    assert [p for p, _ in ocr_cls.batches(split, INFO, 8, limit=2)] == [[1, 0]]
    prepared = ocr_cls.prepare_images(split.images, INFO, 3)
    assert [p for p, _ in prepared] == [[0, 1, 2], [3, 4, 5], [6]]
    np.testing.assert_array_equal(prepared[0][1][2], ocr_cls.collate([ocr_cls.prepare(split.images[2])])[0])
    assert ocr_cls.sample_limits(INFO) == (3, 48, 192) and ocr_cls.example_shapes(INFO) == [(3, 48, 192)]


# ------------------------------------------------------------------ decode, the turn rule, the metric


def test_decode_is_argmax_and_its_probability():
    got = ocr_cls.decode({"probs": _probs([(0, 0.97), (1, 0.95), (1, 0.6)])}, INFO)
    assert [lb for lb, _ in got] == ["0", "180", "180"]
    assert [s for _, s in got] == pytest.approx([0.97, 0.95, 0.6])
    want = {"lines": [{"label": "180", "score": pytest.approx(0.95)}]}
    assert ocr_cls.answer({"probs": _probs([(1, 0.95)])}, INFO) == want


def test_a_line_is_turned_only_when_180_scores_above_cls_thresh():
    assert ocr_cls.to_turn(("180", 0.95), INFO)
    assert not ocr_cls.to_turn(("180", 0.9), INFO)  # predict_cls: score > cls_thresh
    assert not ocr_cls.to_turn(("0", 0.99), INFO)
    assert ocr_cls.to_turn(("180", 0.6), tasks.Info(ocr_cls.LABELS, {"cls_thresh": 0.5}))
    assert ocr_cls.to_turn(("180_degree", 0.95), tasks.Info(("0_degree", "180_degree"), dict(ocr_cls.settings)))


def test_metrics_hand_computed():
    """4 lines: right and sure, right but unsure (180 at 0.6: stays upside down), wrong and unsure (an upright
    line read 180 at 0.8: not turned, so upright), wrong and sure (turned wrongly)."""
    probs = _probs([(0, 0.99), (1, 0.6), (1, 0.8), (1, 0.95)])
    truth = ["0", "180", "0", "0"]
    assert ocr_cls.metrics_of({"probs": probs}, truth, INFO) == {"acc": 0.5, "upright": 0.5}
    split = data.Lines([np.zeros((4, 4, 3), np.uint8)] * 4, truth)
    assert ocr_cls.score(ocr_cls.decode({"probs": probs}, INFO), split, INFO) == {"acc": 0.5, "upright": 0.5}
    with pytest.raises(ValueError):
        ocr_cls.metrics_of({"probs": probs[:3]}, truth, INFO)


def test_orient_answers_in_the_images_order_and_turn_upright_turns_those_to_turn():
    """Each image has its own grey; a fake engine answers 180 at 0.95 for the darker half, 180 at 0.7 for one:
    the answers come back in the images' order, and only the sure 180s are turned (cv2.rotate ROTATE_180)."""
    import cv2

    widths, greys = [400, 60, 150, 90, 60], [10, 60, 110, 160, 210]
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (30, w, 3), dtype=np.uint8) // 4 + g for w, g in zip(widths, greys)]
    for im, g in zip(images, greys):
        im[:4, :4] = g  # resizing keeps a uniform corner
    want = {10: (1, 0.95), 60: (1, 0.95), 110: (1, 0.7), 160: (0, 0.99), 210: (0, 0.99)}

    def run(feeds):
        first = np.round((feeds["x"][:, 0, 0, 0] * 0.5 + 0.5) * 255).astype(int)  # the top-left grey, BGR
        return {"probs": _probs([want[int(g)] for g in first])}

    got = ocr_cls.orient(images, INFO, run, 2)
    assert [lb for lb, _ in got] == ["180", "180", "180", "0", "0"]
    turned = ocr_cls.turn_upright(images, got, INFO)
    for k, (im, out) in enumerate(zip(images, turned)):
        np.testing.assert_array_equal(out, cv2.rotate(im, cv2.ROTATE_180) if k < 2 else im)


# ------------------------------------------------------------------ the contract


def test_from_program_labels_from_inference_yml_and_refusals():
    x = iospec.Tensor("x", "float32", (-1, 3, -1, -1))
    cls = paddle_program.ProgramIO((x,), (iospec.Tensor("s", "float32", (-1, 2)),), (), frozenset())
    assert ocr_cls.from_program(cls, None, {}, "m") == (["0", "180"], {"cls_thresh": 0.9, "input": "x"})
    yml = {"PostProcess": {"name": "ClsPostProcess", "label_list": ["0_degree", "180_degree"]}}
    assert ocr_cls.from_program(cls, None, yml, "m")[0] == ["0_degree", "180_degree"]
    fixed = paddle_program.ProgramIO((iospec.Tensor("x", "float32", (-1, 3, 48, 192)),), cls.outputs, (), frozenset())
    assert ocr_cls.from_program(fixed, None, {}, "m")[0] == ["0", "180"]

    def io(shape_in, shape_out, n_out=1):
        return paddle_program.ProgramIO((iospec.Tensor("x", "float32", shape_in),),
                                        (iospec.Tensor("s", "float32", shape_out),) * n_out, (), frozenset())

    probs = "m: ocr_cls needs class probabilities [N, 2]; output 's' is float32 "
    for pio, keys, yml, needle in [
        (io((-1, 3, 48, -1), (-1, -1, 6625)), None, {}, probs + "[-1, -1, 6625] (a recognizer or a detector?)"),
        (io((-1, 3, -1, -1), (-1, 1, -1, -1)), None, {}, probs + "[-1, 1, -1, -1]"),
        (io((-1, 3, 48, -1), (-1, 4)), None, {}, probs + "[-1, 4]"),
        (io((-1, 3, 32, 100), (-1, 2)), None, {}, "m: ocr_cls takes float32 [N, 3, 48, 192] line images; input 'x' is "
                                                  "float32 [-1, 3, 32, 100]"),
        (io((-1, 3, -1, -1), (-1, 2), 2), None, {}, "m: ocr_cls takes one image input and one output; the program "
                                                    "has 1 and 2"),
        (cls, Path("k.txt"), {}, "m: ocr_cls reads no key file (--keys is ocr_rec's)"),
        (cls, None, {"PostProcess": {"label_list": ["0", "90", "180"]}}, "m: inference.yml PostProcess.label_list "
                                                                         "['0', '90', '180']: ocr_cls needs two"),
        (cls, None, {"PostProcess": {"label_list": ["up", "down"]}}, "one with 180 in it"),
    ]:
        with pytest.raises(InputError) as e:
            ocr_cls.from_program(pio, keys, yml, "m")
        assert needle in str(e.value) and "\n" not in str(e.value)


def test_check_outputs_fidelity_and_training():
    probs = _probs([(0, 0.99), (1, 0.95)])
    ocr_cls.check_outputs({"probs": probs}, INFO, "m")
    for outputs, msg in [
        ({"probs": np.zeros((2, 5, 2), np.float32)}, "m: ocr_cls needs one float [N, 2] output of class "
                                                      "probabilities, got float32 [2, 5, 2]"),
        ({"probs": np.zeros((2, 2), np.int64)}, "m: ocr_cls needs one float [N, 2] output of class probabilities, "
                                                "got int64 [2, 2]"),
        ({"a": probs, "b": probs}, "m: ocr_cls reads one output of class probabilities; the model has 2 (a, b)"),
    ]:
        with pytest.raises(InputError) as e:
            ocr_cls.check_outputs(outputs, INFO, "m")
        assert str(e.value) == msg
    assert ocr_cls.fidelity({"probs": probs}, {"probs": probs[::-1].copy()}, INFO) == {"label_agreement": 0.0}
    assert ocr_cls.fidelity({"probs": probs}, {"probs": probs}, INFO) == {"label_agreement": 1.0}
    assert ocr_cls.files(INFO) == {} and ocr_cls.output_roles([None]) == [("probs", "probs")]
    for fn in (ocr_cls.targets, ocr_cls.loss):
        with pytest.raises(InputError, match="ocr_cls: pipe train does not fine-tune orientation classifiers yet"):
            fn(None, None, INFO)


def test_the_task_is_built_in_and_never_imports_paddle():
    assert tasks.get("ocr_cls") is ocr_cls
    code = ("import sys, numpy as np; from pipeline import tasks; from pipeline.tasks import ocr_cls; "
            "info = tasks.Info(('0', '180'), dict(ocr_cls.settings)); "
            "a = ocr_cls.orient([np.zeros((20, 90, 3), np.uint8)], info, lambda f: {'p': np.ones((1, 2), 'f4')}, 1); "
            "ocr_cls.turn_upright([np.zeros((20, 90, 3), np.uint8)], a, info); "
            "ocr_cls.prepare_images([np.zeros((20, 90, 3), np.uint8)], info, 4); "
            "assert 'paddle' not in sys.modules, 'paddle imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


# ------------------------------------------------------------------ data


def test_generated_lines_are_ocr_recs_half_turned_same_seed_same_bytes():
    """The lines ocr_rec's generator draws without keys, each either as drawn ("0") or turned by 180 degrees
    ("180"), by a seeded draw; the same seed gives the same bytes and labels."""
    a, b = (data.generated((12, 4, 4), ocr_cls.LABELS, seed=3) for _ in range(2))
    drawn = rec_data.generated((12, 4, 4), None, seed=3)  # type: ignore[arg-type]
    labels = []
    for s in ("train", "val", "test"):
        pa, pb, pd = getattr(a, s), getattr(b, s), getattr(drawn, s)
        assert pa.texts == pb.texts and all(np.array_equal(x, y) for x, y in zip(pa.images, pb.images))
        for img, lb, orig in zip(pa.images, pa.texts, pd.images):
            np.testing.assert_array_equal(img, orig[::-1, ::-1] if lb == "180" else orig)
        labels += pa.texts
    assert set(labels) == {"0", "180"} and 5 <= labels.count("180") <= 15  # 20 lines, P(turn) = 0.5
    c = data.generated((12, 4, 4), ocr_cls.LABELS, seed=4)
    assert c.train.texts != a.train.texts or not np.array_equal(c.train.images[0], a.train.images[0])


def _folder(root: Path, label_files: dict[str, bytes]) -> Path:
    """`label_files` beside ten white lines 20 px high, 50-59 px wide, as ocr_rec writes PNGs: 000000.png..."""
    root.mkdir(parents=True)
    rec_data.write_pngs(data.Lines([np.full((20, 50 + i, 3), 255, np.uint8) for i in range(10)], [""] * 10), root)
    for name, body in label_files.items():
        (root / name).write_bytes(body)
    return root


def _load(root: Path | str) -> data.Data:
    return ocr_cls.load_data(config_mod.load(None, [f"data.source={root}"]).data, INFO)


def test_paddleocr_cls_label_files(tmp_path):
    """train.txt and test.txt as configs/cls/cls_mv3.yml names them; val carved out of train (15%, seeded)."""
    rows = [f"{i:06d}.png\t{('0', '180')[i % 2]}" for i in range(8)]
    root = _folder(tmp_path / "d", {"train.txt": "\r\n".join(rows).encode() + b"\r\n",
                                    "test.txt": b"000008.png\t180\n000009.png\t0\n"})
    d = _load(root)
    assert d.test.texts == ["180", "0"] and len(d.train) + len(d.val) == 8 and len(d.val) == 1
    assert sorted(d.train.texts + d.val.texts) == ["0"] * 4 + ["180"] * 4
    assert [im.shape for im in d.test.images] == [(20, 58, 3), (20, 59, 3)]


@pytest.mark.parametrize("files, needle", [
    ({"train.txt": b"000000.png\t0\n000001.png\t90\n"}, "train.txt:2: label '90': ocr_cls takes '0' or '180'"),
    ({"train.txt": b"000000.png\t0\n", "val.txt": b"000001.png\t180 \n"}, "val.txt:1: label '180 ': ocr_cls takes"),
    ({"train.txt": b"000000.png 0\n"}, "train.txt:1: no tab between the image path and its text"),
    ({"train.txt": b"000000.png\t0\nnope.png\t180\n"}, "train.txt:2: nope.png: missing or not a decodable"),
    ({"val.txt": b"000000.png\t0\n", "test.txt": b"\n"}, "test.txt: no label lines"),
])
def test_bad_label_files_in_one_line(tmp_path, files, needle):
    root = _folder(tmp_path / "d", files)
    with pytest.raises(InputError) as e:
        _load(root)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_no_such_file_or_folder(tmp_path):
    with pytest.raises(InputError, match="no such file or folder .ocr_cls takes ocr_lines or PaddleOCR cls label"):
        _load(tmp_path / "nowhere")


def test_a_test_file_alone_a_label_file_or_several_and_a_bad_label_named_in_the_second(tmp_path):
    root = _folder(tmp_path / "d", {"test.txt": b"000000.png\t0\n000001.png\t180\n",
                                    "more.txt": b"000002.png\t180\n"})
    for given, want in ((root, ["0", "180"]), (root / "more.txt", ["180"]),
                        (f"{root / 'test.txt'},{root / 'more.txt'}", ["0", "180", "180"])):
        d = _load(given)
        assert (len(d.train), len(d.val), d.test.texts) == (0, 0, want), given
    (root / "bad.txt").write_bytes(b"000003.png\t90\n")
    with pytest.raises(InputError, match=f"{root / 'bad.txt'}:1: label '90': ocr_cls takes"):
        _load(f"{root / 'test.txt'},{root / 'bad.txt'}")


# ------------------------------------------------------------------ what pipe compress calls


def test_reference_agreement_is_the_share_of_lines_given_the_same_label():
    info = ocr_cls.info_of({"labels": list(ocr_cls.LABELS)})
    ref = ocr_cls.reference_digest({"probs": np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], np.float32)},
                                   info)
    assert set(ref) == {"probs"} and ref["probs"].dtype == np.float32 and ref["probs"].shape == (4, 2)
    same = {"probs": ref["probs"] * 0.9 + 0.05}  # other scores, the same argmax on every line
    assert ocr_cls.reference_agreement(same, ref, info) == 1.0
    one_flipped = {"probs": ref["probs"][:, ::-1] * [[0], [0], [0], [1]] + ref["probs"] * [[1], [1], [1], [0]]}
    assert ocr_cls.reference_agreement(one_flipped, ref, info) == 0.75


def test_subset_keeps_the_rows_asked_for_in_that_order():
    split = data.Lines([np.full((40, 10 * (i + 1), 3), i, np.uint8) for i in range(5)], ["0", "180", "0", "180", "0"])
    sub = ocr_cls.subset(split, [3, 0])
    assert sub.texts == ["180", "0"] and [im.shape[1] for im in sub.images] == [40, 10]
