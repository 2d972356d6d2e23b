"""The detection task (pipeline/tasks/detection/) and its built-in CenterNet (detector.py there): targets,
decoding of perfect heads back to the boxes, COCO mAP, NMS, answers in original pixels, the loss learning a
fixed batch, and the model's size, shapes and jit.save round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.tasks import Info
from pipeline.tasks import detection as det

LABELS = ("rectangle", "ellipse", "triangle")
INFO = Info(labels=LABELS, settings=dict(det.settings))
FEEDS = {"image": np.zeros((1, 3, 64, 64), np.float32)}
# Three images, boxes in model-input pixels (64x64), centres in distinct cells; -1 rows pad to M = 3.
Y = np.array([
    [[10, 13, 31, 29, 1], [40, 40, 60, 58, 0], [0, 0, 0, 0, -1]],
    [[2, 30, 18, 46, 2], [30, 4, 62, 24, 2], [36, 34, 48, 62, 0]],
    [[20, 20, 44, 44, 1], [0, 0, 0, 0, -1], [0, 0, 0, 0, -1]],
], np.float32)


def _radius(h: float, w: float, o: float = 0.7) -> float:
    """CenterNet's gaussian_radius, scalar, as published."""
    b1, c1 = h + w, w * h * (1 - o) / (1 + o)
    b2, c2 = 2 * (h + w), (1 - o) * w * h
    a3, b3, c3 = 4 * o, -2 * o * (h + w), (o - 1) * w * h
    return min((b1 + math.sqrt(b1 ** 2 - 4 * c1)) / 2, (b2 + math.sqrt(b2 ** 2 - 16 * c2)) / 2,
               (b3 + math.sqrt(b3 ** 2 - 4 * a3 * c3)) / 2)


def _perfect(y: np.ndarray, peak: float | list[float] = 1.0) -> dict[str, np.ndarray]:
    """Raw heads whose decoding is exactly `y`: the logit of the target heatmap (times each image's `peak`),
    size/offset at the centres."""
    t = det.targets(y, {"image": np.zeros((len(y), 3, 64, 64), np.float32)}, INFO)
    p = np.clip(t["heatmap"] * np.reshape(peak, (-1, 1, 1, 1)), 1e-6, 1 - 1e-6)
    B, _, h, w = p.shape
    out = {"heatmap": np.log(p / (1 - p)).astype(np.float32)}
    for head in ("size", "offset"):
        m = np.zeros((B, 2, h * w), np.float32)
        b, j = np.nonzero(t["mask"])
        m[b, :, t["index"][b, j]] = t[head][b, j]
        out[head] = m.reshape(B, 2, h, w)
    return out


def test_targets_one_box_and_padding():
    y = np.array([[[10, 13, 31, 29, 1], [0, 0, 0, 0, -1]]], np.float32)
    t = det.targets(y, FEEDS, INFO)
    assert t["heatmap"].shape == (1, 3, 16, 16) and t["heatmap"].dtype == np.float32
    # centre (20.5, 21) px -> (5.125, 5.25) cells: cell (x 5, y 5), offset (0.125, 0.25), size (21, 16) / 4
    heat = t["heatmap"][0, 1]
    assert heat[5, 5] == 1.0 and np.count_nonzero(heat == 1.0) == 1
    assert not t["heatmap"][0, [0, 2]].any()
    np.testing.assert_array_equal(t["index"], [[5 * 16 + 5, 0]])
    assert t["index"].dtype == np.int64
    np.testing.assert_allclose(t["size"][0], [[5.25, 4.0], [0, 0]])
    np.testing.assert_allclose(t["offset"][0], [[0.125, 0.25], [0, 0]])
    np.testing.assert_array_equal(t["mask"], [[1.0, 0.0]])


def test_targets_gaussian_radius():
    y = np.array([[[8, 8, 56, 56, 0]]], np.float32)  # 12x12 cells, centre cell (8, 8)
    r = int(_radius(12, 12))
    heat = det.targets(y, FEEDS, INFO)["heatmap"][0, 0]
    assert r >= 2
    assert heat[8, 8 + r] > 0 and heat[8 - r, 8] > 0 and heat[8, 8 + r + 1] == 0 and heat[8 - r - 1, 8] == 0
    sigma = (2 * r + 1) / 6
    np.testing.assert_allclose(heat[8, 9], math.exp(-1 / (2 * sigma ** 2)), rtol=1e-6)


def test_decode_perfect_outputs_gives_the_boxes_and_map_1():
    dets = det.decode(_perfect(Y), det.settings)
    for d, y in zip(dets, Y):
        truth = y[y[:, 4] >= 0]
        assert d.shape == (len(truth), 6) and d.dtype == np.float32
        assert np.all(np.diff(d[:, 4]) <= 0)
        got = d[np.lexsort(d[:, :4].T[::-1])]
        want = truth[np.lexsort(truth[:, :4].T[::-1])]
        np.testing.assert_allclose(got[:, :4], want[:, :4], atol=0.5)
        np.testing.assert_array_equal(got[:, 5], want[:, 4])
    assert det.coco_map(dets, Y, 3) == pytest.approx({"map": 1.0, "map50": 1.0})
    assert det.metrics_of(_perfect(Y), Y, INFO) == pytest.approx({"map": 1.0, "map50": 1.0})
    wrong = [np.c_[d[:, :5], (d[:, 5] + 1) % 3] for d in dets]
    assert det.coco_map(wrong, Y, 3)["map"] < 0.3
    empty = [np.zeros((0, 6), np.float32)] * len(Y)
    assert det.coco_map(empty, Y, 3) == {"map": 0.0, "map50": 0.0}


def test_decode_thresholds_and_caps():
    out = _perfect(Y, [1.0, 1.0, 0.12])  # the one object of image 2 scores 0.12
    assert len(det.decode(out, det.settings)[2]) == 1
    assert len(det.decode(out, {**det.settings, "score_threshold": 0.2})[2]) == 0
    assert [len(d) for d in det.decode(out, {**det.settings, "max_detections": 1})] == [1, 1, 1]


def test_nms_class_wise():
    a = [0, 0, 10, 10, 0.9, 0]
    b = [1, 0, 11, 10, 0.8, 0]  # IoU 90 / 110 = 0.82 with a
    c = [0, 0, 10, 17, 0.7, 0]  # IoU 100 / 170 = 0.59 with a
    kept = det.nms(np.array([a, b, c], np.float32), 0.6)
    np.testing.assert_allclose(kept, np.array([a, c], np.float32))
    both = det.nms(np.array([a, b[:5] + [1]], np.float32), 0.6)
    assert len(both) == 2


def test_answer_in_original_pixels():
    out = _perfect(Y[:1])
    (scaled,) = det.answer(out, INFO, [(128, 96)])["detections"]  # height 128, width 96: y * 2, x * 1.5
    (plain,) = det.answer(out, INFO, None)["detections"]
    by_label = {a["label"]: a for a in scaled}
    assert set(by_label) == {"ellipse", "rectangle"}
    assert by_label["ellipse"]["box"] == pytest.approx([15.0, 26.0, 46.5, 58.0], abs=0.01)
    assert by_label["rectangle"]["box"] == pytest.approx([60.0, 80.0, 90.0, 116.0], abs=0.01)
    assert {a["label"]: a["box"] for a in plain}["ellipse"] == pytest.approx([10, 13, 31, 29], abs=0.01)
    assert all(isinstance(a["score"], float) and a["score"] > 0.99 for a in scaled)


# ------------------------------------------------------------------ with paddle


@pytest.fixture(scope="module")
def paddle():
    from pipeline.runtime import import_paddle

    p = import_paddle(2)
    p.set_device("cpu")
    return p


def _images(y: np.ndarray) -> np.ndarray:
    """Noise with each box filled by its class's colour."""
    rng = np.random.default_rng(0)
    x = rng.normal(0, 0.3, (len(y), 3, 64, 64)).astype(np.float32)
    for i, rows in enumerate(y):
        for x1, y1, x2, y2, c in rows[rows[:, 4] >= 0].astype(int):
            x[i, :, y1:y2, x1:x2] = np.eye(3, dtype=np.float32)[c][:, None, None] * 2 - 1
    return x


def test_loss_finite_and_decreasing(paddle):
    from pipeline.tasks.detection.detector import centernet_tiny

    paddle.seed(0)
    net = centernet_tiny(3)
    opt = paddle.optimizer.Adam(learning_rate=5e-3, parameters=net.parameters())
    x = paddle.to_tensor(_images(Y))
    t = {k: paddle.to_tensor(v) for k, v in det.targets(Y, {"image": x.numpy()}, INFO).items()}
    losses = []
    for _ in range(30):
        loss = det.loss(paddle.nn.functional, net(x), t, INFO)
        assert loss.shape == [] and loss.dtype == paddle.float32
        losses.append(float(loss))
        loss.backward()
        opt.step()
        opt.clear_grad()
    assert np.all(np.isfinite(losses))
    assert losses[-1] < 0.05 * losses[0] and losses[-1] < 0.5, losses


def test_loss_is_small_for_perfect_heads(paddle):
    t = {k: paddle.to_tensor(v) for k, v in det.targets(Y, FEEDS, INFO).items()}
    perfect = {k: paddle.to_tensor(v) for k, v in _perfect(Y).items()}
    off = {**perfect, "size": perfect["size"] + 1.0}
    F = paddle.nn.functional
    good = float(det.loss(F, perfect, t, INFO))
    assert good < 0.05
    assert float(det.loss(F, off, t, INFO)) == pytest.approx(good + 0.1, abs=1e-4)  # 0.1 * mean L1 of 1


def test_model_size_shapes_and_jit_round_trip(paddle, tmp_path):
    from pipeline.tasks.detection.detector import centernet_tiny

    paddle.seed(0)
    net = centernet_tiny(3)
    n = sum(int(np.prod(p.shape)) for p in net.parameters())
    assert 150_000 <= n <= 260_000, n
    np.testing.assert_allclose(net.heatmap[-1].bias.numpy(), -2.19)
    net.eval()
    x = np.random.default_rng(1).normal(size=(2, 3, 64, 64)).astype(np.float32)
    with paddle.no_grad():
        ref = {k: v.numpy() for k, v in net(paddle.to_tensor(x)).items()}
    assert {k: v.shape for k, v in ref.items()} == {"heatmap": (2, 3, 16, 16), "size": (2, 2, 16, 16),
                                                    "offset": (2, 2, 16, 16)}
    spec = [paddle.static.InputSpec([-1, 3, -1, -1], "float32", "image")]
    paddle.jit.save(paddle.jit.to_static(net, input_spec=spec, full_graph=True), str(tmp_path / "model"))
    loaded = paddle.jit.load(str(tmp_path / "model"))
    got = loaded(paddle.to_tensor(x))  # a dict's values, in its sorted key order
    for name, g in zip(sorted(ref), got):
        np.testing.assert_allclose(g.numpy(), ref[name], atol=1e-5)
    assert [tuple(g.shape) for g in loaded(paddle.to_tensor(x[:1, :, :48]))] == [(1, 3, 12, 16), (1, 2, 12, 16),
                                                                                  (1, 2, 12, 16)]
