"""ocr_rec's contract against upstream's definitions (PaddleOCR's resize_norm_img, CTCLabelDecode, RecMetric
and label files), the gaps tests/test_ocr_rec.py leaves, and the real PP-OCRv4 recognizer on generated lines
through the task's own pre-processing, batching, decode and metric."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import config as config_mod, pretrained, tasks
from pipeline.errors import InputError
from pipeline.tasks import ocr_rec
from pipeline.tasks.ocr_rec import data, lines, text

KEYS = ("a", "b", "中", "文")  # classes: blank 0, a 1, b 2, 中 3, 文 4, space 5
INFO = tasks.Info(KEYS, dict(ocr_rec.settings))


@pytest.fixture(scope="module")
def real_keys() -> tuple[str, ...]:
    return text.read_keys(pretrained.ppocr() / pretrained.KEYS)


def _probs(rows: list[list[int]], p: float = 0.9, classes: int = len(KEYS) + 2) -> np.ndarray:
    """[N, T, C] with `p` on each step's class, the rest spread evenly."""
    out = np.full((len(rows), len(rows[0]), classes), (1 - p) / (classes - 1), np.float32)
    for n, row in enumerate(rows):
        for t, c in enumerate(row):
            out[n, t, c] = p
    return out


# ------------------------------------------------------------------ decode


def test_ctc_greedy_per_row_of_a_batch():
    probs = _probs([[1, 0, 1, 1, 5, 2],   # a, blank, a a (merged), space, b -> "aa b"
                    [0, 0, 0, 0, 0, 0],   # all blank -> "", 0.0 (RapidOCR: mean of [0])
                    [5, 5, 3, 0, 3, 4]])  # leading space, 中 blank 中 -> " 中中文"
    got = text.ctc_greedy(probs, KEYS)
    assert [t for t, _ in got] == ["aa b", "", " 中中文"]
    assert got[1] == ("", 0.0)
    assert got[0][1] == pytest.approx(0.9) and got[2][1] == pytest.approx(0.9)


def test_the_score_takes_the_first_step_of_a_repeat_and_skips_blanks():
    probs = _probs([[1, 1, 0, 2]])
    probs[0, 0, 1], probs[0, 1, 1], probs[0, 2, 0], probs[0, 3, 2] = 0.6, 0.99, 0.2, 0.8
    ((t, score),) = text.ctc_greedy(probs, KEYS)
    assert t == "ab" and score == pytest.approx((0.6 + 0.8) / 2)  # CTCLabelDecode's selection


# ------------------------------------------------------------------ metric


def test_metrics_hand_computed():
    # Levenshtein.normalized_distance = distance / max(len): "中文b" vs "中文a" 1/3; "" vs "ab" 1
    got = text.metrics(["中文b", "", "a b", "ab"], ["中文a", "ab", "ab", "ab"])
    assert got == {"acc": 0.5, "norm_edit_dis": pytest.approx(1 - (1 / 3 + 1 + 0 + 0) / 4)}
    kept = text.metrics(["a b", "中 文"], ["ab", "中 文"], ignore_space=False)
    assert kept == {"acc": 0.5, "norm_edit_dis": pytest.approx(1 - (1 / 3 + 0) / 2)}
    # NFKC first, then spaces go: the ideographic space U+3000 becomes " " and is ignored too
    assert text.metrics(["中\u3000文，"], ["中文,"], nfkc=True)["acc"] == 1.0
    assert all(isinstance(v, float) for v in got.values())


def test_metrics_refuse_a_missing_answer():
    with pytest.raises(ValueError):
        text.metrics(["a"], ["a", "b"])


def test_metrics_of_reads_the_settings():
    probs = _probs([[3, 5, 4]])  # "中 文"
    assert ocr_rec.metrics_of({"probs": probs}, ["中文"], INFO)["acc"] == 1.0
    strict = tasks.Info(KEYS, {**ocr_rec.settings, "ignore_space": False})
    assert ocr_rec.metrics_of({"probs": probs}, ["中文"], strict)["acc"] == 0.0


# ------------------------------------------------------------------ keys


def test_the_real_key_file_against_a_model_of_another_size(real_keys):
    text.check_classes(real_keys, 6625, "ppocr_keys_v1.txt")
    with pytest.raises(InputError) as e:
        text.check_classes(real_keys[:-3], 6625, "ppocr_keys_v1.txt")
    assert str(e.value) == ("ppocr_keys_v1.txt: 6,620 keys + blank + space = 6,622 classes, the model's output "
                            "has 6,625")


def test_key_file_line_endings(tmp_path):
    p = tmp_path / "k.txt"
    p.write_bytes("a\r\nb\n中".encode())  # mixed endings, no newline at the end
    assert text.read_keys(p) == ("a", "b", "中")
    p.write_bytes(" \n".encode())  # a space is a key like any other
    assert text.read_keys(p) == (" ",)
    with pytest.raises(InputError, match="cannot read the key file"):
        text.read_keys(tmp_path / "missing.txt")


# ------------------------------------------------------------------ pre-processing and batches


def _paddleocr_resize_norm_img(bgr: np.ndarray, max_wh_ratio: float) -> np.ndarray:
    """PaddleOCR's / RapidOCR's resize_norm_img for rec_image_shape 3,48,320, as a reference."""
    import cv2

    img_w = int(48 * max_wh_ratio)
    h, w = bgr.shape[:2]
    resized_w = min(img_w, int(math.ceil(48 * (w / float(h)))))
    x = cv2.resize(bgr, (resized_w, 48)).astype("float32").transpose((2, 0, 1)) / 255
    x -= 0.5
    x /= 0.5
    out = np.zeros((3, 48, img_w), np.float32)
    out[:, :, :resized_w] = x
    return out


@pytest.mark.parametrize("hw", [(32, 100), (49, 100), (24, 100), (60, 7), (500, 3), (40, 1500)])
def test_prepare_and_collate_equal_paddleocrs_resize_on_bgr(hw):
    rgb = np.random.default_rng(sum(hw)).integers(0, 256, (*hw, 3), dtype=np.uint8)
    got = lines.collate([lines.prepare(rgb, 3200)], 64, 320)[0]
    assert got.shape[2] % 64 == 0 and got.shape[2] >= 320
    want = _paddleocr_resize_norm_img(np.ascontiguousarray(rgb[:, :, ::-1]), got.shape[2] / 48)
    np.testing.assert_array_equal(got, want)


def test_widths_keep_the_aspect_ratio_within_bounds():
    assert lines.width(49, 100, 3200) == 98  # ceil(97.96)
    assert lines.width(500, 3, 3200) == 1  # at least one column
    assert lines.width(10, 1000, 3200) == 3200  # capped at max_width
    assert lines.batch_width([1, 321], 64, 320) == 384 and lines.batch_width([10], 64, 320) == 320


def test_plan_sorts_by_width_in_batches_of_at_most_size():
    widths = [700, 100, 300, 100, 2000, 50, 320]
    got = list(lines.plan(widths, 3))
    assert [len(b) for b in got] == [3, 3, 1]
    flat = [i for b in got for i in b]
    assert sorted(flat) == list(range(len(widths)))
    assert [widths[i] for i in flat] == sorted(widths)


def test_recognise_answers_in_the_images_order():
    """Each image is a different grey; a fake engine spells each row's grey as a key: the answers must come
    back in the order of the images, not of the width-sorted batches."""
    widths = [400, 60, 900, 150, 60, 3000]
    greys = [10, 60, 110, 160, 210, 250]
    images = [np.full((30, w, 3), g, np.uint8) for w, g in zip(widths, greys)]
    seen = []

    def run(feeds):
        x = feeds["x"]
        seen.append(x.shape)
        first = np.round((x[:, 0, 0, 0] * 0.5 + 0.5) * 255).astype(int)  # the row's grey, unnormalised
        return {"probs": _probs([[1 + greys.index(int(g)) % 4, 0] for g in first])}

    got = ocr_rec.recognise(images, INFO, run, 2)
    assert [t for t, _ in got] == [KEYS[i % 4] for i in range(len(images))]
    assert [s[0] for s in seen] == [2, 2, 2] and [s[3] for s in seen] == [320, 640, 3200]


# ------------------------------------------------------------------ the contract


def test_check_outputs_refuses_what_is_no_recognizer():
    ok = {"probs": _probs([[1, 2]])}
    ocr_rec.check_outputs(ok, INFO, "m")
    bad = {
        "two outputs": ({"a": ok["probs"], "b": ok["probs"]}, "m: ocr_rec reads one output of per-step class "
                                                               "probabilities; the model has 2 (a, b)"),
        "classifier": ({"probs": np.zeros((2, 6), np.float32)}, "m: ocr_rec needs one float [N, T, 6] output, got "
                                                                "float32 [2, 6]"),
        "other keys": ({"probs": np.zeros((2, 4, 9), np.float32)}, "m: ocr_rec needs one float [N, T, 6] output, "
                                                                   "got float32 [2, 4, 9]"),
        "ints": ({"probs": np.zeros((2, 4, 6), np.int64)}, "m: ocr_rec needs one float [N, T, 6] output, got int64 "
                                                           "[2, 4, 6]"),
    }
    for outputs, msg in bad.values():
        with pytest.raises(InputError) as e:
            ocr_rec.check_outputs(outputs, INFO, "m")
        assert str(e.value) == msg and "\n" not in msg


def test_answer_fidelity_and_training():
    probs = _probs([[1, 0, 2], [3, 3, 4], [5, 0, 0]])
    got = ocr_rec.answer({"probs": probs}, INFO)
    assert [x["text"] for x in got["lines"]] == ["ab", "中文", " "]
    assert all(isinstance(x["score"], float) for x in got["lines"])
    other = probs.copy()
    other[1] = _probs([[3, 0, 3]])[0]  # "中中"
    assert ocr_rec.fidelity({"probs": other}, {"probs": probs}, INFO) == {"text_agreement": pytest.approx(2 / 3)}
    # training targets: class ids (space = keys + 1), blank-padded; a character the keys lack is dropped
    y = ocr_rec.targets(["ab", "中 文", "x中"], None, INFO)
    assert y["labels"].tolist() == [[1, 2, 0], [3, 5, 4], [3, 0, 0]] and y["label_lengths"].tolist() == [2, 3, 1]
    from pipeline import runtime

    paddle = runtime.import_paddle(1)
    F = paddle.nn.functional
    t = {k: paddle.to_tensor(v) for k, v in ocr_rec.targets(["ab", "中文", " "], None, INFO).items()}
    right = float(ocr_rec.loss(F, {"probs": paddle.to_tensor(probs)}, t, INFO))
    wrong = float(ocr_rec.loss(F, {"probs": paddle.to_tensor(_probs([[2, 0, 1], [4, 4, 3], [1, 0, 0]]))}, t, INFO))
    assert 0 < right < 1 < wrong  # CTC of the path the probabilities spell, against a path they do not


def test_the_task_never_imports_paddle():
    code = ("import sys, numpy as np; from pipeline import tasks; from pipeline.tasks import ocr_rec; "
            "info = tasks.Info(('a',), dict(ocr_rec.settings)); "
            "ocr_rec.recognise([np.zeros((20, 90, 3), np.uint8)], info, lambda f: {'p': np.ones((1, 5, 3), 'f4')}, 1); "
            "assert 'paddle' not in sys.modules, 'paddle imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parent.parent)


# ------------------------------------------------------------------ label files


def _folder(root: Path, label_files: dict[str, bytes]) -> Path:
    from PIL import Image

    (root / "img").mkdir(parents=True)
    for i in range(10):
        Image.new("RGB", (50 + i, 20), "white").save(root / "img" / f"{i}.png")
    for name, body in label_files.items():
        (root / name).write_bytes(body)
    return root


def _load(root: Path | str) -> data.Data:
    return data.load(config_mod.load(None, [f"data.source={root}"]).data, KEYS)


def test_label_files_crlf_and_separators_inside_a_text(tmp_path):
    rows = [f"img/{i}.png\t文{i}" for i in range(8)] + ["img/8.png\ta\u2028b\x85c"]
    root = _folder(tmp_path / "d", {"train.txt": "\r\n".join(rows).encode() + b"\r\n",
                                    "val.txt": b"img/9.png\tab\r\n", "test.txt": b"img/0.png\t\xe4\xb8\xad\n"})
    d = _load(root)
    texts = d.train.texts + d.val.texts
    assert "a\u2028b\x85c" in texts and "ab" in texts and d.test.texts == ["中"]
    assert not any(t.endswith("\r") for t in texts)


def test_an_image_folder_may_be_a_symlink(tmp_path):
    elsewhere = _folder(tmp_path / "disk", {})
    root = tmp_path / "d"
    root.mkdir()
    (root / "img").symlink_to(elsewhere / "img")
    (root / "train.txt").write_text("".join(f"img/{i}.png\tx{i}\n" for i in range(10)), encoding="utf-8")
    d = _load(root)
    assert len(d.train) + len(d.val) + len(d.test) == 10


@pytest.mark.parametrize("body, needle", [
    (b"img/0.png\tok\n\xff\xfe\n", "train.txt: not UTF-8"),
    (b"\n\n", "train.txt: no label lines"),
    (b"img/0.png\tok\nnot-an-image.txt\tx\n", "train.txt:2: not-an-image.txt: missing or not a decodable image"),
    (b"img/0.png\tok\n\tno path\n", "train.txt:2: : missing or not a decodable image"),
    (b"img/0.png\tok\n/etc/hostname\tx\n", "train.txt:2: /etc/hostname: outside the data folder"),
    (b"img/../../x.png\tx\n", "train.txt:1: img/../../x.png: outside the data folder"),
])
def test_more_bad_label_files_in_one_line(tmp_path, body, needle):
    root = _folder(tmp_path / "d", {"train.txt": body, "not-an-image.txt": b"hello"})
    with pytest.raises(InputError) as e:
        _load(root)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_folder_without_train_holds_the_splits_it_has(tmp_path):
    """pipe import measures on whatever the folder holds: no train.txt is no error here (pipe train refuses it)."""
    root = _folder(tmp_path / "d", {"test.txt": b"img/0.png\tok\nimg/1.png\tno\n"})
    d = _load(root)
    assert (len(d.train), len(d.val), d.test.texts) == (0, 0, ["ok", "no"])
    assert d.files == {"test": [str(root / "test.txt")]}
    assert tasks.splits(ocr_rec, d) == f"test (2 lines of {root / 'test.txt'})"
    _folder(tmp_path / "e", {"val.txt": b"img/0.png\tok\n", "rec_gt_test.txt": b"img/1.png\tno\n"})
    d = _load(tmp_path / "e")
    assert (len(d.train), d.val.texts, d.test.texts) == (0, ["ok"], ["no"])
    with pytest.raises(InputError, match=r"a folder without a label file: none of train.txt, rec_gt_train.txt"):
        _load(_folder(tmp_path / "f", {"labels.txt": b"img/0.png\tok\n"}))


def test_one_label_file_is_the_test_split_its_paths_relative_to_its_folder(tmp_path):
    root = _folder(tmp_path / "d", {"rec_gt.txt": "".join(f"img/{i}.png\t文{i}\n" for i in range(3)).encode()})
    d = _load(root / "rec_gt.txt")
    assert (len(d.train), len(d.val), d.test.texts) == (0, 0, ["文0", "文1", "文2"])
    assert [im.shape[1] for im in d.test.images] == [50, 51, 52]
    assert d.files == {"test": [str(root / "rec_gt.txt")]}


def test_several_label_files_comma_separated_are_concatenated_each_from_its_own_folder(tmp_path):
    """PaddleOCR's label_file_list: the lines of each in order; img/0.png is a different image in each folder."""
    a = _folder(tmp_path / "a", {"l.txt": b"img/0.png\tA0\nimg/1.png\tA1\n"})
    b = tmp_path / "b"
    (b / "img").mkdir(parents=True)
    from PIL import Image

    Image.new("RGB", (90, 30), "white").save(b / "img" / "0.png")
    (b / "l.txt").write_text("img/0.png\tB0\n", encoding="utf-8")
    d = _load(f"{a / 'l.txt'},{b / 'l.txt'}")
    assert d.test.texts == ["A0", "A1", "B0"] and len(d.train) == len(d.val) == 0
    assert [im.shape[:2] for im in d.test.images] == [(20, 50), (20, 51), (30, 90)]
    assert tasks.splits(ocr_rec, d) == f"test (3 lines of {a / 'l.txt'}, {b / 'l.txt'})"


@pytest.mark.parametrize("given, body, needle", [
    ("missing.txt", None, "--data {d}/missing.txt: no such file or folder (ocr_rec takes"),
    ("l.txt,{d}/missing.txt", b"img/0.png\tok\n", "{d}/missing.txt: no such label file"),
    ("l.txt", b"\n \n", "{d}/l.txt: no label lines"),
    ("l.txt,{d}/l.txt", b"\n", "{d}/l.txt: no label lines"),
    ("l.txt", b"img/0.png\tok\nimg/missing.png\tx\n", "{d}/l.txt:2: img/missing.png: missing or not a decodable image"),
])
def test_a_bad_label_file_is_refused_in_one_line_naming_it(tmp_path, given, body, needle):
    root = _folder(tmp_path / "d", {} if body is None else {"l.txt": body})
    with pytest.raises(InputError) as e:
        _load(f"{root}/" + given.format(d=root))
    assert needle.format(d=root) in str(e.value) and "\n" not in str(e.value), str(e.value)


# ------------------------------------------------------------------ generated lines


def test_generated_lines_same_seed_same_bytes(real_keys):
    a, b = (data.generated((20, 5, 5), real_keys, seed=9) for _ in range(2))
    for s in ("train", "val", "test"):
        x, y = getattr(a, s), getattr(b, s)
        assert x.texts == y.texts and [i.tobytes() for i in x.images] == [i.tobytes() for i in y.images]
    every = a.train.texts + a.val.texts + a.test.texts
    assert set("".join(every)) <= set(real_keys)
    assert all(len(t) >= 2 for t in every) and any(c.isascii() and c.isalnum() for t in every for c in t)
    assert all(i.dtype == np.uint8 and i.shape[2] == 3 and 30 <= i.shape[0] <= 70 for i in a.train.images)


def test_the_font_renders_simplified_punctuation():
    """PP-OCRv4 reads SC text; the wheel's font is the TC build, whose full-width comma sits in the middle of
    its cell: in a Han run, `data.LANGUAGE` puts it at the bottom left (facts §17: ~20 points otherwise)."""
    from PIL import Image, ImageDraw, ImageFont, features

    assert features.check_feature("raqm")
    font = ImageFont.truetype(str(data.font_path()), 40, layout_engine=ImageFont.Layout.RAQM)

    def comma_ink(language):
        im = Image.new("L", (160, 60), 0)
        ImageDraw.Draw(im).text((10, 5), "中，中", font=font, fill=255, language=language)
        ys, xs = np.nonzero(np.asarray(im)[:, 50:90])  # the comma's 40 px cell
        return xs.mean(), ys.mean()

    (x_sc, y_sc), (x_tc, y_tc) = comma_ink(data.LANGUAGE), comma_ink("zh-Hant")
    assert x_sc < 15 < x_tc and y_sc > y_tc + 8


def test_a_damaged_cache_is_rebuilt_and_leaves_no_temporary_files(tmp_path, real_keys):
    cfg = config_mod.load(None, ["data.source=ocr_lines", "data.ocr_lines=12", f"data.cache_dir={tmp_path}"]).data
    first = data.load(cfg, real_keys)
    (npz,) = (tmp_path / "ocr_lines").glob("*.npz")
    npz.write_bytes(npz.read_bytes()[:100])  # a truncated zip
    again = data.load(cfg, real_keys)
    assert again.train.texts == first.train.texts
    assert all(np.array_equal(x, y) for x, y in zip(again.train.images, first.train.images))
    assert sorted(p.suffix for p in (tmp_path / "ocr_lines").iterdir()) == [".json", ".npz"]


# ------------------------------------------------------------------ the real recognizer


@pytest.mark.slow
def test_the_real_pp_ocrv4_recognizer_reads_generated_lines(real_keys):
    """PP-OCRv4 rec through the task's prepare/batches/decode/metric on 50 generated lines. Engine: OpenVINO on
    the legacy program (the same fp32 answers as Paddle Inference, bench/OCR.md; 0.3 GB here, where Paddle
    Inference with oneDNN kept 4.9 GB over these lines' 8 widths; tests/stages/test_import.py runs Paddle)."""
    import openvino as ov

    core = ov.Core()
    core.set_property("CPU", {"INFERENCE_NUM_THREADS": int(os.environ.get("PIPE_TEST_THREADS", "2"))})
    model = core.compile_model(core.read_model(str(pretrained.ppocr() / pretrained.MODELS["rec"] /
                                                   "inference.pdmodel")), "CPU")
    lines_ = data.generated((50, 0, 0), real_keys, seed=5).train
    info = tasks.Info(real_keys, dict(ocr_rec.settings))

    def run(feeds):
        outputs = {"probs": model(feeds["x"])[0]}
        ocr_rec.check_outputs(outputs, info, "PP-OCRv4 rec")
        return outputs

    answers = ocr_rec.recognise(lines_.images, info, run, 6)
    got = ocr_rec.score(answers, lines_, info)
    assert got["acc"] >= 0.85 and got["norm_edit_dis"] >= 0.97, got  # measured 0.96 / 0.996


# ------------------------------------------------------------------ agreement with fp32 (compress, reference set)


def test_agreement_is_per_character_and_ignores_what_the_metric_ignores():
    """A line differing in one character of four agrees 0.75, not 0; a trailing space the model emits at the
    right margin is no difference, as RecMetric (ignore_space) sees it; decoded from the digest's CTC path."""
    ref = _probs([[1, 0, 2, 3, 4, 0], [3, 3, 0, 4, 0, 0]])  # "ab中文", "中文"
    got = _probs([[1, 0, 2, 3, 3, 0], [3, 0, 4, 0, 5, 0]])  # "ab中" (one lost), "中文 " (a trailing space)
    digest = lambda p: ocr_rec.reference_digest({"probs": p}, INFO)  # noqa: E731
    assert ocr_rec.reference_agreement(digest(got), digest(ref), INFO) == pytest.approx((0.75 + 1.0) / 2)
    assert ocr_rec.reference_agreement(digest(ref), digest(ref), INFO) == 1.0
    keep = tasks.Info(KEYS, {**ocr_rec.settings, "ignore_space": False})
    assert ocr_rec.reference_agreement(digest(got), digest(ref), keep) == pytest.approx((0.75 + 2 / 3) / 2)
    assert ocr_rec.fidelity({"probs": got[1:]}, {"probs": ref[1:]}, INFO) == {"text_agreement": 1.0}
    assert ocr_rec.subset(ocr_rec.data_mod.Lines([np.zeros(1), np.ones(1)], ["x", "y"]), [1]).texts == ["y"]


def test_pipe_all_fingerprints_each_label_file_of_a_comma_list(tmp_path):
    """`pipe all` re-runs import when any listed label file changes (not just when the list's text does)."""
    from stages import all_ as orchestrate

    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("img/0.png\tx\n", encoding="utf-8")
    b.write_text("img/1.png\ty\n", encoding="utf-8")
    before = orchestrate._fingerprint(f"{a},{b}")
    b.write_text("img/1.png\tz\n", encoding="utf-8")
    assert orchestrate._fingerprint(f"{a},{b}") != before


def test_compress_stands_in_a_split_the_label_data_lacks_and_says_so_in_one_line(tmp_path, capsys):
    """A label file is a test split only: compress calibrates and searches on it, one line each; a folder of
    val and test calibrates on val; data with every split is left as it is, silently."""
    from pipeline import compress_owned

    root = _folder(tmp_path / "d", {"test.txt": b"img/0.png\tok\nimg/1.png\tno\n", "val.txt": b"img/2.png\tv\n"})
    only_test = _load(root / "test.txt")
    d, roles = compress_owned._stand_ins(only_test, "d/test.txt", "lines")
    assert roles == {"train": "test", "val": "test", "test": "test"}
    assert d.train is d.val is d.test is only_test.test
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "compress: no train split in data.source 'd/test.txt': calibrating on the test split (2 lines)"
    assert out[1].startswith("compress: no val split in data.source 'd/test.txt': the int8 search") and len(out) == 2
    d, roles = compress_owned._stand_ins(_load(root), "d", "lines")
    assert roles == {"train": "val", "val": "val", "test": "test"} and d.train.texts == ["v"]
    assert capsys.readouterr().out == "compress: no train split in data.source 'd': calibrating on the val split (1 lines)\n"
    whole = data.Data(*(data.Lines([np.zeros((4, 4, 3), np.uint8)], ["x"]) for _ in range(3)))
    assert compress_owned._stand_ins(whole, "x", "lines") == (whole, {s: s for s in data.SPLITS})
    assert capsys.readouterr().out == ""
