"""ocr_det's data: pages (RGB uint8 [H, W, 3]) with their text lines' polygons and transcriptions, train/val/test.

- `ocr_pages` (built in): pages 480-1024 px a side on a plain, gradient or noisy ground, each with 3-12 lines
  of the corpus ocr_rec reads (`ocr_rec.data.corpus_lines`), drawn with ocr_rec's font in its Simplified
  forms, 18-44 px, dark on light or (a fifth) light on dark; about a third of the pages turned by up to
  +-10 degrees. A line's ground truth is its text's layout box (PIL's getbbox, 2 px added each side),
  turned with it: 4 points clockwise from the top left. Deterministic by seed; `data.ocr_pages` pages for
  train, 15% as many each for val and test. Not cached: a page draws in ~80 ms here.
- PaddleOCR detection label files, each line `image_path<TAB>[{"transcription": ..., "points": [[x, y], ...]},
  ...]` (4 or more points; "###" or "*" = don't care), the path relative to the label file's folder, given as
  ocr_rec's are (`ocr_rec.data.label_files`): a folder holding any of `train.txt`, `val.txt`, `test.txt` (or
  `det_gt_train.txt`, `det_gt_val.txt`, `det_gt_test.txt`; a missing val or test carved out of train, when
  there is one), or one label file or several comma-separated (label_file_list): the test split.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import InputError
from pipeline.tasks.ocr_rec import data as rec_data

BUILT_IN = "ocr_pages"
_LABEL_FILES = {"train": ("train.txt", "det_gt_train.txt"), "val": ("val.txt", "det_gt_val.txt"),
                "test": ("test.txt", "det_gt_test.txt")}
_FRACTION = 0.15
_PAD = 2  # px around a line's layout box in its ground truth


@dataclass(frozen=True)
class Pages:
    images: list[np.ndarray]
    polys: list[list[np.ndarray]]  # per page, each line's float32 [P, 2] polygon (P >= 4)
    texts: list[list[str]]  # per page, each line's transcription ("###": don't care)

    def __len__(self) -> int:
        return len(self.images)


@dataclass(frozen=True)
class Data:
    train: Pages
    val: Pages
    test: Pages
    files: dict[str, list[str]] = field(default_factory=dict)  # label data: each split's label files read


def load(cfg: Any) -> Data:
    """`cfg` is the run's DataConfig (source, ocr_pages, split_seed)."""
    if cfg.source == BUILT_IN:
        n = int(cfg.ocr_pages)
        m = max(1, round(n * _FRACTION))
        return generated((n, m, m))
    files = rec_data.label_files(cfg.source, _LABEL_FILES, f"ocr_det takes {BUILT_IN} or PaddleOCR detection "
                                 f"label files")
    rows = rec_data.read_splits(files, int(cfg.split_seed), read_label_file, "pages")
    parts = {s: Pages([r[0] for r in rs], [r[1] for r in rs], [r[2] for r in rs]) for s, rs in rows.items()}
    return Data(**parts, files={s: [str(p) for p in ps] for s, ps in files.items()})


# ------------------------------------------------------------------ PaddleOCR label files


def read_label_file(path: Path) -> list[tuple[np.ndarray, list[np.ndarray], list[str]]]:
    """One detection label file's pages: (image, polygons, transcriptions) each."""
    def parse(root: Path, rel: str, label: str, where: str) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
        ps, ts = _parse_label(label, where)
        return rec_data.label_image(root, rel, where), ps, ts

    return rec_data.read_label_file(path, parse, "labels (PaddleOCR's 'image_path<TAB>[{\"transcription\": ..., "
                                                 "\"points\": ...}]')")


def _parse_label(label: str, where: str) -> tuple[list[np.ndarray], list[str]]:
    """One line's JSON list of {"transcription", "points"} (DetLabelEncode's fields)."""
    try:
        doc = json.loads(label)
    except ValueError as e:
        raise InputError(f"{where}: the labels are not JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(doc, list):
        raise InputError(f"{where}: the labels must be a JSON list of {{\"transcription\", \"points\"}} objects")
    polys, texts = [], []
    for k, item in enumerate(doc, 1):
        text = item.get("transcription") if isinstance(item, dict) else None
        pts = item.get("points") if isinstance(item, dict) else None
        if not isinstance(text, str):
            raise InputError(f"{where}: label {k} has no \"transcription\" string")
        if not _is_points(pts):
            raise InputError(f"{where}: label {k}'s \"points\" must be 4 or more [x, y] number pairs")
        polys.append(np.array(pts, np.float32))
        texts.append(text)
    return polys, texts


def _is_points(pts: Any) -> bool:
    return (isinstance(pts, list) and len(pts) >= 4 and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                    and math.isfinite(v) for v in p) for p in pts))


# ------------------------------------------------------------------ generated pages


def generated(counts: tuple[int, int, int], seed: int = 0) -> Data:
    """Train, val and test pages, `counts` of each; the same seed gives the same bytes."""
    from PIL import features

    if not features.check_feature("raqm"):  # as ocr_rec: without raqm the lines render in Traditional forms
        raise InputError(f"data.source {BUILT_IN}: Pillow has no raqm text layout here (install libfribidi0)")
    total = sum(counts)
    font_file = rec_data.font_path()
    texts = rec_data.corpus_lines(None, total * 12, seed)
    rngs = np.random.default_rng(seed + 1).spawn(total)
    pages = [page(texts[i * 12: (i + 1) * 12], r, font_file) for i, r in enumerate(rngs)]
    a, b = counts[0], counts[0] + counts[1]

    def part(ps: list[tuple[np.ndarray, list[np.ndarray], list[str]]]) -> Pages:
        return Pages([p[0] for p in ps], [p[1] for p in ps], [p[2] for p in ps])

    return Data(part(pages[:a]), part(pages[a:b]), part(pages[b:]))


def page(candidates: list[str], rng: np.random.Generator, font_file: Path
         ) -> tuple[np.ndarray, list[np.ndarray], list[str]]:
    """One page: (RGB image, each line's float32 [4, 2] quadrilateral, each line's text). Lines go top to
    bottom at random left offsets, cut to fit the width; one that would leave the page is not drawn."""
    from PIL import Image

    h, w = (int(v) for v in rng.integers(480, 1025, 2))
    dark = rng.random() < 0.2
    im = Image.fromarray(_ground(h, w, dark, rng))
    angle = float(rng.uniform(-10, 10)) if rng.random() < 0.35 else 0.0
    want = int(rng.integers(3, 13))
    polys, texts, y = [], [], float(rng.integers(10, 40))
    for text in candidates[:want]:
        drawn = _line(im, text, y, angle, dark, rng, font_file)
        if drawn is None:
            break
        quad, text, y = drawn
        polys.append(quad)
        texts.append(text)
    a = np.asarray(im).astype(np.float32) + rng.normal(0, float(rng.uniform(0, 5)), (h, w, 3))
    return np.clip(a, 0, 255).astype(np.uint8), polys, texts


def _ground(h: int, w: int, dark: bool, rng: np.random.Generator) -> np.ndarray:
    """A plain, vertical-gradient or blotchy ground, light (or dark), RGB uint8."""
    lo, hi = (20, 90) if dark else (185, 256)
    top, bottom = rng.integers(lo, hi, 3), rng.integers(lo, hi, 3)
    kind = int(rng.integers(3))
    if kind == 0:
        g = np.broadcast_to(top, (h, w, 3)).astype(np.float32)
    elif kind == 1:
        t = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
        g = np.broadcast_to(top * (1 - t) + bottom * t, (h, w, 3)).astype(np.float32)
    else:  # low-frequency blotches: a coarse random grid blown up
        import cv2

        coarse = rng.uniform(lo, hi - 1, (4, 4, 3)).astype(np.float32)
        g = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    return np.clip(g, 0, 255).astype(np.uint8)


def _line(im: Any, text: str, y: float, angle: float, dark: bool, rng: np.random.Generator, font_file: Path
          ) -> tuple[np.ndarray, str, float] | None:
    """Draw one line at height `y`, turned by `angle` about its centre: (its quadrilateral, the text drawn, the
    next line's y), or None when it does not fit below `y`."""
    from PIL import Image, ImageDraw, ImageFont

    size = int(rng.integers(18, 45))
    font = ImageFont.truetype(str(font_file), size, layout_engine=ImageFont.Layout.RAQM)
    W, H = im.size
    while len(text) > 2 and font.getbbox(text, language=rec_data.LANGUAGE)[2] > 0.85 * W:
        text = text[:-1]
    l, t, r, b = font.getbbox(text, language=rec_data.LANGUAGE)
    bw, bh = r - l + 2 * _PAD, b - t + 2 * _PAD
    mask = Image.new("L", (bw, bh), 0)
    ImageDraw.Draw(mask).text((_PAD - l, _PAD - t), text, font=font, fill=255, language=rec_data.LANGUAGE)
    turned = mask.rotate(angle, resample=Image.BICUBIC, expand=True)
    x0 = float(rng.integers(10, max(11, W - turned.size[0] - 10)))
    if y + turned.size[1] > H - 10 or x0 + turned.size[0] > W - 5:
        return None
    ink = tuple(int(v) for v in (rng.integers(200, 256, 3) if dark else rng.integers(0, 80, 3)))
    im.paste(Image.new("RGB", turned.size, ink), (int(x0), int(y)), turned)
    quad = _turned_box(bw, bh, angle, turned.size) + np.array([int(x0), int(y)], np.float32)
    return quad, text, y + turned.size[1] + float(rng.integers(4, 30))


def _turned_box(bw: int, bh: int, angle: float, size: tuple[int, int]) -> np.ndarray:
    """The corners of a bw x bh box (tl, tr, br, bl) after PIL's rotate(angle, expand=True): counter-clockwise
    on screen about the centre, the result centred in the expanded `size`."""
    a = math.radians(angle)
    c, s = math.cos(a), math.sin(a)
    corners = np.array([[0, 0], [bw, 0], [bw, bh], [0, bh]], np.float64) - [bw / 2, bh / 2]
    x = corners[:, 0] * c + corners[:, 1] * s + size[0] / 2
    y = -corners[:, 0] * s + corners[:, 1] * c + size[1] / 2
    return np.stack([x, y], 1).astype(np.float32)
