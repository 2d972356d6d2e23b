"""The recognizer's characters, its answer and its metric: PaddleOCR's key file, CTC greedy decoding
(`CTCLabelDecode`) and line accuracy with 1 - normalised edit distance (`RecMetric`).

Classes: 0 is the CTC blank, 1..K the key file's lines in order, K + 1 the space (PaddleOCR's
`use_space_char: True`, what every PP-OCRv4 rec export was trained with): K + 2 in all, 6,625 for
`ppocr_keys_v1.txt`'s 6,623 keys.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from pipeline.errors import InputError

BLANK = 0


def read_keys(path: Path) -> tuple[str, ...]:
    """A key file as PaddleOCR reads it: UTF-8, one key per line ("\\n" or "\\r\\n" stripped, nothing else)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{path}: cannot read the key file ({e.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: the key file is not UTF-8 (byte {e.start})") from None
    keys = tuple(line.rstrip("\r") for line in text.split("\n"))
    if keys and keys[-1] == "":
        keys = keys[:-1]  # the newline that ends the last line
    return check_keys(keys, str(path))


def check_keys(keys: Sequence[str], where: str) -> tuple[str, ...]:
    keys = tuple(keys)
    if not keys:
        raise InputError(f"{where}: the key file holds no characters")
    bad = next((i for i, k in enumerate(keys) if len(k) != 1), None)
    if bad is not None:
        raise InputError(f"{where}: line {bad + 1} holds {len(keys[bad])} characters; a key file has one a line")
    return keys


def classes(keys: Sequence[str]) -> int:
    return len(keys) + 2


def check_classes(keys: Sequence[str], n_classes: int, where: str) -> None:
    if classes(keys) != n_classes:
        raise InputError(f"{where}: {len(keys):,} keys + blank + space = {classes(keys):,} classes, the model's "
                         f"output has {n_classes:,}")


def encode(texts: Sequence[str], keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """CTC targets of `texts`: (labels int32 [N, L] padded with the blank, lengths int64 [N], characters dropped).
    A character the keys do not hold is dropped, as PaddleOCR's CTCLabelEncode drops it."""
    index = {k: i + 1 for i, k in enumerate(keys)}
    space = len(keys) + 1
    rows, dropped = [], 0
    for t in texts:
        ids = [space if c == " " else index.get(c, -1) for c in t]
        dropped += ids.count(-1)
        rows.append([i for i in ids if i != -1])
    labels = np.zeros((len(rows), max([1, *(len(r) for r in rows)])), np.int32)
    for i, r in enumerate(rows):
        labels[i, :len(r)] = r
    return labels, np.asarray([len(r) for r in rows], np.int64), dropped


def ctc_greedy(probs: np.ndarray, keys: Sequence[str]) -> list[tuple[str, float]]:
    """[N, T, C] per-step class probabilities -> (text, score) per line: argmax, repeats merged, blanks
    dropped; score = the mean of the kept steps' max probabilities (0.0 for an empty line), as CTCLabelDecode."""
    probs = np.asarray(probs)
    idx = probs.argmax(axis=2)
    top = np.take_along_axis(probs, idx[..., None], axis=2)[..., 0]
    keep = idx != BLANK
    keep[:, 1:] &= idx[:, 1:] != idx[:, :-1]
    chars = ("",) + tuple(keys) + (" ",)
    out = []
    for row, k, p in zip(idx, keep, top):
        kept = row[k]
        out.append(("".join(chars[i] for i in kept), float(p[k].mean()) if kept.size else 0.0))
    return out


def normalise(text: str, ignore_space: bool, nfkc: bool) -> str:
    if nfkc:
        text = unicodedata.normalize("NFKC", text)
    return text.replace(" ", "") if ignore_space else text


def metrics(preds: Iterable[str], targets: Iterable[str], ignore_space: bool = True, nfkc: bool = False) -> dict[str, float]:
    """RecMetric: `acc` = exact matches / lines, `norm_edit_dis` = 1 - mean normalised Levenshtein distance
    (rapidfuzz's, as PaddleOCR's `Levenshtein.normalized_distance`); spaces removed from both first by default."""
    from rapidfuzz.distance import Levenshtein

    n = correct = 0
    dist = 0.0
    for p, t in zip(preds, targets, strict=True):  # a missing answer is a bug, not a shorter split
        p, t = normalise(p, ignore_space, nfkc), normalise(t, ignore_space, nfkc)
        correct += p == t
        dist += Levenshtein.normalized_distance(p, t)
        n += 1
    if n == 0:
        return {"acc": 0.0, "norm_edit_dis": 0.0}
    return {"acc": correct / n, "norm_edit_dis": 1.0 - dist / n}
