"""How training batches are drawn and fed: the global batch order of a data-parallel run, and the dataset
whose `collate` turns a batch's sample positions into the model's named inputs.

Both go to a `paddle.io.DataLoader` (`batch_sampler=`, `collate_fn=`); nothing here imports paddle.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from pipeline import data as data_mod


class GlobalBatchSampler:
    """Global batch k of epoch e is `perm(seed, e)[k*B:(k+1)*B]`; rank r takes its r-th slice.

    The order is a pure function of (seed, epoch), whatever the world size, so a resumed or
    re-sharded run sees the same batches, and 1 process equals N at the same global batch."""

    def __init__(self, n: int, global_batch: int, rank: int, world: int, seed: int):
        self.n, self.global_batch, self.rank, self.world, self.seed = n, global_batch, rank, world, seed
        self.local = global_batch // world
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __len__(self) -> int:
        return self.n // self.global_batch

    def __iter__(self):
        perm = np.random.RandomState([self.seed, self.epoch]).permutation(self.n)
        for k in range(self.start, len(self)):
            lo = k * self.global_batch + self.rank * self.local
            yield perm[lo:lo + self.local].tolist()


class FeedDataset:
    """Map-style dataset over a Split yielding sample positions; `collate` reads and prepares a whole batch
    at once (vectorised) into the model's named inputs, exactly as export and serve prepare theirs."""

    def __init__(self, split: data_mod.Split, pre: dict[str, Any], targets: Callable[[np.ndarray, dict[str, np.ndarray]], Any]):
        self.split, self.pre, self.targets = split, pre, targets  # targets: the task's (stored y, feeds) -> loss input

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, i: int) -> int:
        return i

    def collate(self, batch: list[int]) -> tuple[dict[str, np.ndarray], Any]:
        pos = np.asarray(batch, np.int64)
        feeds = self.split.feeds(pos, self.pre)
        return feeds, self.targets(np.asarray(self.split.y[self.split.idx[pos]]), feeds)


class MixedBatchSampler:
    """A GlobalBatchSampler over the user's lines, each global batch followed by `general` lines drawn from
    another split (fine-tuning's rehearsal: finetune.mix), numbered after the user's (`n` + j). Global batch k of
    epoch e draws them from (seed, e, k) alone, so the batches are the same at any world size and on resume; rank
    r takes its r-th slice of each part."""

    def __init__(self, user: GlobalBatchSampler, n_general: int, general: int):
        self.user, self.n_general, self.general = user, n_general, general
        self.local = general // user.world

    @property
    def epoch(self) -> int:
        return self.user.epoch

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.user.set_epoch(epoch, start)

    def __len__(self) -> int:
        return len(self.user)

    def __iter__(self):
        u = self.user
        for k, pos in enumerate(u, start=u.start):
            if not self.local:
                yield pos
                continue
            drawn = np.random.RandomState([u.seed, u.epoch, k, 1]).choice(self.n_general, self.general, replace=False)
            mine = drawn[u.rank * self.local:(u.rank + 1) * self.local]
            yield pos + [u.n + int(j) for j in mine]


class OwnedDataset:
    """Map-style dataset for a task that owns its data (ocr_rec): positions of the user's train split, then of the
    general lines (`MixedBatchSampler`); `collate` hands the batch's images and texts to the task's
    `training_batch`. Augmentation draws from a generator per (seed, epoch, position): the same line is
    augmented alike at any world size and on resume, and differently each epoch."""

    def __init__(self, task: Any, info: Any, user: Any, general: Any, sampler: Any, seed: int, augment: bool):
        self.task, self.info, self.user, self.general = task, info, user, general
        self.sampler, self.seed, self.augment = sampler, seed, augment

    def __len__(self) -> int:
        return len(self.user) + (len(self.general) if self.general is not None else 0)

    def __getitem__(self, i: int) -> int:
        return i

    def collate(self, batch: list[int]) -> tuple[dict[str, np.ndarray], Any]:
        n = len(self.user)
        pick = [(self.user, p) if p < n else (self.general, p - n) for p in batch]
        images = [s.images[i] for s, i in pick]
        texts = [s.texts[i] for s, i in pick]
        rngs = ([np.random.default_rng([self.seed, self.sampler.epoch, p]) for p in batch] if self.augment else None)
        return self.task.training_batch(images, texts, self.info, rngs)
