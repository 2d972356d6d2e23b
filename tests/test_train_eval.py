"""pipe train shares an imported program's evaluation among the ranks (pipeline/trainer.py `_read_share`): each rank
reads every world-th batch of the split, and the whole split's scores from the shares are one process's, to the
bit. Here two ranks are played in one process on a small real Paddle net over rendered lines; the real exchange
between two launched processes (all_gather_object over gloo) runs in tests/stages/test_finetune.py."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import runtime, tasks
from pipeline.errors import PipeError
from pipeline.tasks import ocr_rec
from pipeline.tasks.ocr_rec import data, text
from pipeline import trainer

KEYS = tuple("abcdefgh")


@pytest.fixture(scope="module")
def paddle():
    return runtime.import_paddle(1)


@pytest.fixture(scope="module")
def split() -> data.Lines:
    """70 lines of 1-40 characters: three batches of 32 lines or fewer, of several widths."""
    rng = np.random.default_rng(0)
    texts = ["".join(rng.choice(list(KEYS), int(rng.integers(1, 41)))) for _ in range(70)]
    font = data.font_path()
    return data.Lines([data.render(t, rng, font) for t in texts], texts)


def _trainer(paddle, rank: int, world: int, tmp_path, calls: list[int]):
    """A trainer of rank `rank` of `world` holding a small real net: [N, 3, 48, W] -> per 8 columns, softmax over
    blank + KEYS + space."""
    paddle.seed(0)
    classes = text.classes(KEYS)

    class Net(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(3 * 48 * 8, classes)

        def forward(self, x):
            n, _, _, w = x.shape
            steps = x.reshape([n, 3 * 48, w // 8, 8]).transpose([0, 2, 1, 3]).reshape([n, w // 8, 3 * 48 * 8])
            return paddle.nn.functional.softmax(self.fc(steps), axis=-1)

    def call(net, feeds):
        calls.append(len(feeds["x"]))
        return net(feeds["x"])

    t = trainer.Trainer(trainer.Ctx(None, rank, world, print, paddle), tmp_path, tmp_path)
    t.net, t.call, t.task, t.info = Net(), call, ocr_rec, tasks.Info(KEYS, dict(ocr_rec.settings))
    return t


def test_two_ranks_read_half_each_and_score_as_one_process(paddle, split, tmp_path):
    alone: list[int] = []
    one_loss, one = _trainer(paddle, 0, 1, tmp_path, alone)._evaluate_owned(split)
    assert len(alone) >= 3 and sum(alone) == len(split)  # one process reads every batch
    assert one_loss > 0 and set(one) == {"acc", "norm_edit_dis"}
    calls: list[list[int]] = [[], []]
    ranks = [_trainer(paddle, r, 2, tmp_path, calls[r]) for r in (0, 1)]
    shares = [t._read_share(split) for t in ranks]
    for r in (0, 1):  # rank r reads batches r, r + 2, ... and nothing else
        assert [b for b, *_ in shares[r]] == list(range(r, len(alone), 2))
        assert calls[r] == alone[r::2]
    for t in ranks:  # either rank scores the gathered shares as the single process did, to the bit
        loss, got = t._scores(split, shares[0] + shares[1])
        assert loss == one_loss and got == one
    assert ranks[0]._scores(split, shares[1] + shares[0]) == (one_loss, one)  # whatever order they arrive in


def test_a_missing_share_is_an_error_not_a_score(paddle, split, tmp_path):
    t = _trainer(paddle, 0, 2, tmp_path, [])
    with pytest.raises(PipeError, match=f"evaluation: the ranks read \\d+ of {len(split)} lines"):
        t._scores(split, t._read_share(split))
