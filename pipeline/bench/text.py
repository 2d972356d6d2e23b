"""`make bench` rows for the text task: the example config trained from scratch vs a linear baseline.

    python -c "from pipeline.bench import text; print(text.rows(1))"

Trains `examples/chinese_sentiment.yaml` (its model and hyperparameters) through the real train stage,
`repeats` times, and fits a character 1-2-gram TF-IDF + logistic regression baseline on the same
deduplicated split in the same process. CPU training is deterministic, so repeats only spread the
wall time; the machine is shared, so the time is an upper bound, the accuracies are exact.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from pipeline import config as config_mod

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chinese_sentiment.yaml"
_ACC_GOAL = 0.87
_TIME_GOAL_S = 300.0


def rows(repeats: int) -> list[tuple[str, str, str, str]]:
    from pipeline import data as data_mod
    from stages import train as train_stage

    cfg = config_mod.load(_EXAMPLE)
    accs, times = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="pipe-bench-text-") as d:
            t0 = time.perf_counter()
            out = train_stage.run(cfg, Path(d) / "train", view=lambda ev: None)
            times.append(time.perf_counter() - t0)
            accs.append(json.loads((out / "manifest.json").read_text())["metrics"]["test_acc"])
    acc, wall = statistics.median(accs), statistics.median(times)
    base, base_note = _tfidf_baseline(data_mod.load(cfg.data))
    t = cfg.train
    note = (f"{cfg.model.name}, {t.epochs} epochs, batch {t.batch_size}, lr {t.lr:g}, "
            f"{cfg.dist.nproc_per_node} process(es), {repeats} repeat(s)")
    spread = f" ({min(times):.0f}-{max(times):.0f})" if repeats > 1 else ""
    return [
        (f"text: {note}: test accuracy", f"{acc:.2%}", f">= {_ACC_GOAL:.0%}",
         "met" if acc >= _ACC_GOAL else "**missed**"),
        ("text: train wall time from scratch (data, training, checkpoints), median s", f"{wall:.0f}{spread}",
         f"<= {_TIME_GOAL_S:.0f} s", "met" if wall <= _TIME_GOAL_S else "**missed**"),
        (f"text: baseline, {base_note}: test accuracy", f"{base:.2%}", "reported", ""),
        ("text: model minus baseline, points", f"{100 * (acc - base):+.1f}", "> 0",
         "met" if acc > base else "**missed**"),
    ]


def _tfidf_baseline(ds: Any) -> tuple[float, str]:
    """Character 1-2-gram TF-IDF (sublinear tf) + logistic regression on the full texts; C picked on val."""
    import numpy as np
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    def split(s: Any) -> tuple[list[str], np.ndarray]:
        return [ds.texts[i] for i in s.idx], np.asarray(s.y[s.idx])

    (xtr, ytr), (xva, yva), (xte, yte) = split(ds.train), split(ds.val), split(ds.test)
    vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 2), sublinear_tf=True)
    ftr, fva, fte = vec.fit_transform(xtr), vec.transform(xva), vec.transform(xte)
    best = None
    for c in (1.0, 4.0, 16.0):
        clf = LogisticRegression(C=c, max_iter=2000).fit(ftr, ytr)
        val = clf.score(fva, yva)
        if best is None or val > best[0]:
            best = (val, c, clf)
    _, c, clf = best
    return float(clf.score(fte, yte)), f"char 1-2-gram TF-IDF + logistic regression (C={c:g}, chosen on val)"
