"""ocr_rec's data: line images (RGB uint8 [H, W, 3], any width) with their texts, train/val/test.

- `ocr_lines` (built in): Chinese text lines cut from the corpus pipe ships (`pipeline/assets/
  chinese_sentiment.tsv.xz`), a third with ASCII digits or letters mixed in, kept only if the model's keys
  hold every character, rendered with Noto Sans CJK (OFL; the `cvttf-notosanscjk-regular` wheel) in its
  Simplified-Chinese forms (PIL's raqm layout with language zh-Hans: that wheel is the Traditional build and
  its centred punctuation costs ~20 points, facts §17), at several sizes, ink and paper shades, with mild
  noise and blur; deterministic by seed, cached under data.cache_dir ($PIPE_CACHE_DIR or ~/.cache/pipe).
  `data.ocr_lines` lines for train, 15% as many each for val and test.
- `ocr_lines_dotmatrix` (built in): a domain PP-OCRv4 reads badly, for fine-tuning: short lines (2-10
  characters of the same corpus, cut at the end until the line's prepared width is at most 320 px) in a
  dot-matrix print, as inkjet date codes on packaging and receipt printers print them: the same font
  rendered at 10-14 px (one dot a pixel, a dot where the glyph covers more than a third of it), each dot a
  small round blob on a 3-4 px grid, a little off it; the same ink, paper and noise as `ocr_lines`.
  Deterministic by seed, cached beside `ocr_lines` (the style in the cache key); counts as `ocr_lines`.
- `ocr_lines_scan` (built in): what fine-tuning's guard judges forgetting by (finetune.held_out): corpus lines
  as `ocr_lines`' (2-25 characters, other texts) in another font, Noto Sans CJK Light (the
  `cvttf-notosanscjk-light` wheel), on other paper, degraded another way: a grey ground lit unevenly, turned
  up to 1.5 degrees, scanned at 55-90% of its size and back, saved as a JPEG of quality 35-75. Rehearsal
  (finetune.general, `ocr_lines`) never draws it, so the guard measures what the model knew, not how well
  it remembers its rehearsal set. Deterministic by seed, cached as the other styles.
- PaddleOCR recognition label files, each line `image_path<TAB>text` with the path relative to the label
  file's folder (PaddleOCR joins it to data_dir; pipe's data_dir is that folder):
  - a folder holding any of `train.txt`, `val.txt`, `test.txt` (or `rec_gt_train.txt`, `rec_gt_val.txt`,
    `rec_gt_test.txt`); with a train file, a missing val or test is carved out of train (15% each, seeded by
    data.split_seed); without one, the splits present are all there is (pipe import measures on them; pipe
    train refuses it);
  - one label file, or several comma-separated (`a.txt,b.txt`: PaddleOCR's label_file_list, their lines
    concatenated): the test split, the one split there is (what `Eval.dataset.label_file_list` names).
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import unicodedata
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from pipeline.errors import InputError
from pipeline.tasks.ocr_rec import lines

BUILT_IN = "ocr_lines"
# data.source ocr_lines_<style>: generated lines drawn another way (`styled`); each style's generator version
# is its cache key (bump when its rendering changes)
STYLES = {"dotmatrix": "1", "scan": "1"}
_ASSETS = Path(__file__).resolve().parents[2] / "assets"
_LABEL_FILES = {"train": ("train.txt", "rec_gt_train.txt"), "val": ("val.txt", "rec_gt_val.txt"),
                "test": ("test.txt", "rec_gt_test.txt")}
SPLITS = ("train", "val", "test")
_FRACTION = 0.15
_GENERATOR = "1"  # bump when rendering changes: the cache key
# Simplified-Chinese glyphs from the Traditional build: raqm applies the font's `locl` for this language, which
# puts full-width punctuation in a Han run at the bottom left (SC) instead of the centre (TC)
LANGUAGE = "zh-Hans"


@dataclass(frozen=True)
class Lines:
    images: list[np.ndarray]
    texts: list[str]

    def __len__(self) -> int:
        return len(self.texts)


@dataclass(frozen=True)
class Data:
    train: Lines
    val: Lines
    test: Lines
    files: dict[str, list[str]] = field(default_factory=dict)  # label data: each split's label files read


def load(cfg: Any, keys: Sequence[str]) -> Data:
    """`cfg` is the run's DataConfig (source, ocr_lines, split_seed, cache_dir)."""
    style = "" if cfg.source == BUILT_IN else style_of(cfg.source)
    if style is not None:
        n = int(cfg.ocr_lines)
        m = max(1, round(n * _FRACTION))
        return _generated((n, m, m), keys, cache_root(cfg), style)
    files = label_files(cfg.source, _LABEL_FILES, f"ocr_rec takes {BUILT_IN}, generated lines in another style "
                        f"({', '.join(f'{BUILT_IN}_{s}' for s in STYLES)}) or PaddleOCR label files")
    return from_label_files(files, int(cfg.split_seed))


def style_of(source: str) -> str | None:
    """The style a data.source `ocr_lines_<style>` names (None: not such a name, or a file or folder of that
    name, which stays one); an unknown style is refused."""
    prefix = BUILT_IN + "_"
    if not source.startswith(prefix) or Path(source).exists():
        return None
    style = source[len(prefix):]
    if style not in STYLES:
        raise InputError(f"data.source {source}: no such style of generated lines (built in: {BUILT_IN}, "
                         f"{', '.join(prefix + s for s in STYLES)})")
    return style


def cache_root(cfg: Any) -> Path:
    return Path(cfg.cache_dir or os.environ.get("PIPE_CACHE_DIR") or Path.home() / ".cache" / "pipe")


# ------------------------------------------------------------------ PaddleOCR label files


def label_files(source: str, names: dict[str, tuple[str, ...]], takes: str) -> dict[str, list[Path]]:
    """The PaddleOCR label files data.source names, by split: a folder's train/val/test files (`names`: each
    split's file names, the first found taken; at least one split), or one file or several comma-separated
    (label_file_list), all the test split. `takes`: what the task takes, for the message of a missing one."""
    path = Path(source)
    if path.is_dir():
        found = {s: [next(path / n for n in ns if (path / n).is_file())] for s, ns in names.items()
                 if any((path / n).is_file() for n in ns)}
        if not found:
            raise InputError(f"--data {source}: a folder without a label file: none of "
                             f"{', '.join(n for ns in names.values() for n in ns)}")
        return found
    parts = [path] if path.exists() or "," not in source else [Path(p.strip()) for p in source.split(",") if p.strip()]
    for p in parts:
        if not p.is_file():
            what = f"--data {source}: {p}: no such label file" if len(parts) > 1 else \
                f"--data {source}: no such file or folder"
            raise InputError(f"{what} ({takes}: one label file, several comma-separated, "
                             f"or a folder of them: {', '.join(ns[0] for ns in names.values())})")
    return {"test": parts}


def read_splits(files: dict[str, list[Path]], seed: int, read: Callable[[Path], list[Any]], unit: str
                ) -> dict[str, list[Any]]:
    """Each split's rows (`read`: one label file's), the files of a split concatenated in order; with a train
    split, the val and test it lacks are carved out of it (`carve`); without one, the splits given only."""
    rows = {s: [r for p in ps for r in read(p)] for s, ps in files.items()}
    if "train" in rows:
        train = rows["train"]
        left, carved = carve(len(train), set(rows), seed, f"{files['train'][0]}: {len(train)} {unit}")
        rows = {**rows, "train": [train[i] for i in left], **{s: [train[i] for i in ix] for s, ix in carved.items()}}
    return {s: rows.get(s, []) for s in SPLITS}


def from_label_files(files: dict[str, list[Path]], seed: int) -> Data:
    rows = read_splits(files, seed, _read_label_file, "lines")
    parts = {s: Lines([r[0] for r in rs], [r[1] for r in rs]) for s, rs in rows.items()}
    return Data(**parts, files={s: [str(p) for p in ps] for s, ps in files.items()})


def carve(n: int, have: set[str], seed: int, what: str) -> tuple[list[int], dict[str, list[int]]]:
    """A label folder's splits: (the train rows kept for training, {split: train rows} for each of val and test
    the folder lacks, 15% of train each, seeded by data.split_seed); `what` names the train file's rows."""
    order = np.random.default_rng(seed).permutation(n)
    take = max(1, round(n * _FRACTION))
    carved: dict[str, list[int]] = {}
    at = 0
    for s in ("val", "test"):
        if s not in have:
            carved[s] = sorted(order[at: at + take].tolist())
            at += take
    left = sorted(order[at:].tolist())
    if not left:
        raise InputError(f"{what} leave none for training after carving val/test out")
    return left, carved


def label_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, line) of a PaddleOCR label file's non-blank lines, split on "\\n" only as PaddleOCR splits
    (a label may hold U+2028 or \\x85), "\\r" dropped."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8") from None
    for n, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if line.strip():
            yield n, line


def label_image(root: Path, rel: str, where: str) -> np.ndarray:
    """The image a label line names (`where`: file:line), RGB uint8, from inside the data folder `root`."""
    from PIL import Image, UnidentifiedImageError

    # checked by name, not resolved: images/ may be a symlink to another disk; ../ and /abs are refused
    if Path(rel).is_absolute() or os.path.normpath(rel).split(os.sep)[0] == "..":
        raise InputError(f"{where}: {rel}: outside the data folder {root}")
    try:
        with Image.open(root / rel) as im:
            return np.asarray(im.convert("RGB"))
    except (OSError, UnidentifiedImageError, ValueError):
        raise InputError(f"{where}: {rel}: missing or not a decodable image") from None


def read_label_file(path: Path, parse: Callable[[Path, str, str, str], Any], form: str) -> list[Any]:
    """One label file's rows, `parse(folder, image path, label, "file:line")` each, the image path relative to
    the file's folder; `form`: the line's format, for the message of a line without a tab."""
    rows = []
    for n, line in label_lines(path):
        rel, tab, label = line.partition("\t")
        if not tab:
            raise InputError(f"{path}:{n}: no tab between the image path and its {form}")
        rows.append(parse(path.parent, rel, label, f"{path}:{n}"))
    if not rows:
        raise InputError(f"{path}: no label lines")
    return rows


def _read_label_file(path: Path) -> list[tuple[np.ndarray, str]]:
    return read_label_file(path, lambda root, rel, label, where: (label_image(root, rel, where), label),
                           "text (PaddleOCR's 'image_path<TAB>text')")


def write_pngs(lines: Lines, dest: Path) -> list[Path]:
    """Each line image as a PNG in `dest` (what a client or a peer tool reads), in order."""
    from PIL import Image

    paths = []
    for i, img in enumerate(lines.images):
        p = dest / f"{i:06d}.png"
        Image.fromarray(img).save(p)
        paths.append(p)
    return paths


# ------------------------------------------------------------------ generated lines


def font_path(weight: str = "Regular") -> Path:
    """Noto Sans CJK's file of `weight`: Regular (every style but scan's) or Light (scan's), each a wheel."""
    import importlib

    return Path(importlib.import_module(f"cvttf_NotoSansCJK_{weight}").get_TTF_path())


def corpus_lines(keys: Sequence[str] | None, count: int, seed: int) -> list[str]:
    """`count` lines of 2-25 characters from the shipped corpus, a third with ASCII mixed in, every character
    among `keys` (None: any letter, digit or punctuation, for a detector, which reads no keys); seeded."""
    raw = lzma.decompress((_ASSETS / "chinese_sentiment.tsv.xz").read_bytes()).decode("utf-8")
    texts = sorted({t.split("\t", 1)[1].strip() for t in raw.splitlines() if "\t" in t})
    # no keys: letters, digits and punctuation (no emoji: the font has none, a tofu box is no text)
    allowed = set(keys) if keys is not None else {c for t in texts for c in t if unicodedata.category(c)[0] in "LNP"}
    rng = np.random.default_rng(seed)
    ascii_words = ["2026", "OK", "A4", "USB", "Wi-Fi", "100%", "PP-OCR", "x86", "3.5", "No.7", "CPU", "2.0"]
    out: list[str] = []
    while len(out) < count:
        t = texts[int(rng.integers(len(texts)))]
        t = "".join(c for c in t if c in allowed and not c.isspace())
        if len(t) < 2:
            continue
        n = int(rng.integers(2, 26))
        start = int(rng.integers(0, max(1, len(t) - n + 1)))
        line = t[start: start + n]
        if rng.random() < 1 / 3:
            word = ascii_words[int(rng.integers(len(ascii_words)))]
            at = int(rng.integers(0, len(line) + 1))
            line = line[:at] + word + line[at:]
        if len(line) >= 2 and all(c in allowed for c in line):
            out.append(line)
    return out


def render(text: str, rng: np.random.Generator, font_file: Path) -> np.ndarray:
    """One line: size 26-40 px, dark ink on a light ground (sometimes coloured), margins 3-12 px, a third
    blurred a little, mild Gaussian noise; RGB uint8."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    size = int(rng.integers(26, 41))
    font = ImageFont.truetype(str(font_file), size, layout_engine=ImageFont.Layout.RAQM)
    l, t, r, b = font.getbbox(text, language=LANGUAGE)
    mx, my = (int(v) for v in rng.integers(3, 13, 2))
    paper = rng.integers(190, 256, 3) if rng.random() < 0.3 else np.full(3, int(rng.integers(205, 256)))
    ink = rng.integers(0, 90, 3) if rng.random() < 0.3 else np.full(3, int(rng.integers(0, 70)))
    im = Image.new("RGB", (r - l + 2 * mx, b - t + 2 * my), tuple(int(v) for v in paper))
    ImageDraw.Draw(im).text((mx - l, my - t), text, font=font, fill=tuple(int(v) for v in ink), language=LANGUAGE)
    if rng.random() < 1 / 3:
        im = im.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.3, 0.9))))
    a = np.asarray(im).astype(np.float32)
    a += rng.normal(0, float(rng.uniform(0, 6)), a.shape)
    return np.clip(a, 0, 255).astype(np.uint8)


def _check_raqm(source: str) -> None:
    from PIL import features

    if not features.check_feature("raqm"):  # Pillow's wheels bundle raqm; it loads libfribidi from the OS
        raise InputError(f"data.source {source}: Pillow has no raqm text layout here (install libfribidi0); "
                         f"without it the lines render in Traditional forms")


def generated(counts: tuple[int, int, int], keys: Sequence[str], seed: int = 0) -> Data:
    _check_raqm(BUILT_IN)
    font_file = font_path()
    total = sum(counts)
    texts = corpus_lines(keys, total, seed)
    rngs = np.random.default_rng(seed + 1).spawn(total)
    images = [render(t, r, font_file) for t, r in zip(texts, rngs)]
    a, b = counts[0], counts[0] + counts[1]
    return Data(Lines(images[:a], texts[:a]), Lines(images[a:b], texts[a:b]), Lines(images[b:], texts[b:]))


def short_lines(keys: Sequence[str], count: int, seed: int) -> list[str]:
    """`count` pieces of 2-10 characters of `corpus_lines` (keys held), seeded."""
    rng = np.random.default_rng([seed, 1])  # not corpus_lines' own stream
    out = []
    for t in corpus_lines(keys, count, seed):
        n = int(rng.integers(2, 11))
        start = int(rng.integers(0, max(1, len(t) - n + 1)))
        out.append(t[start: start + n])
    return out


def render_dotmatrix(text: str, rng: np.random.Generator, font_file: Path, max_width: int = 320
                     ) -> tuple[np.ndarray, str]:
    """One line in dot-matrix print, and the text drawn: the longest start of `text` (2 characters at least)
    whose prepared width (lines.width) is at most `max_width`. The glyphs at 10-14 dots to the em (a dot
    where the font, drawn 4x as large, covers more than a third of the dot's cell), each dot a round blob of
    0.4-0.7 of its 3-4 px cell, placed up to 0.15 cell off the grid; margins 1-3 cells; ink, paper and noise
    as `render`'s. RGB uint8."""
    from PIL import Image, ImageDraw, ImageFont

    k = 4  # supersampling, of the glyphs' coverage and of the dots' edges
    em, cell = int(rng.integers(10, 15)), int(rng.integers(3, 5))
    mx, my = (int(v) for v in rng.integers(1, 4, 2))
    dot = float(rng.uniform(0.4, 0.7))
    paper = rng.integers(190, 256, 3) if rng.random() < 0.3 else np.full(3, int(rng.integers(205, 256)))
    ink = rng.integers(0, 90, 3) if rng.random() < 0.3 else np.full(3, int(rng.integers(0, 70)))
    font = ImageFont.truetype(str(font_file), em * k, layout_engine=ImageFont.Layout.RAQM)
    while True:
        l, t, r, b = font.getbbox(text, language=LANGUAGE)
        cols, rows = -(-(r - l) // k), -(-(b - t) // k)
        w, h = (cols + 2 * mx) * cell, (rows + 2 * my) * cell
        if len(text) <= 2 or lines.width(h, w, 10 ** 6) <= max_width:
            break
        text = text[:-1]
    glyphs = Image.new("L", (cols * k, rows * k), 0)
    ImageDraw.Draw(glyphs).text((-l, -t), text, font=font, fill=255, language=LANGUAGE)
    on = np.asarray(glyphs, np.float32).reshape(rows, k, cols, k).mean(axis=(1, 3)) > 255 / 3
    big = Image.new("L", (w * k, h * k), 0)
    draw = ImageDraw.Draw(big)
    ys, xs = np.nonzero(on)
    jitter = rng.uniform(-0.15, 0.15, (len(ys), 2))
    radius = dot * cell * k / 2
    for y, x, (jy, jx) in zip(ys, xs, jitter):
        cy, cx = (y + my + 0.5 + jy) * cell * k, (x + mx + 0.5 + jx) * cell * k
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=255)
    cover = np.asarray(big.resize((w, h), Image.Resampling.BOX), np.float32)[:, :, None] / 255
    a = paper.astype(np.float32) * (1 - cover) + ink.astype(np.float32) * cover
    a += rng.normal(0, float(rng.uniform(0, 6)), a.shape)
    return np.clip(a, 0, 255).astype(np.uint8), text


def render_scan(text: str, rng: np.random.Generator, font_file: Path) -> tuple[np.ndarray, str]:
    """One line as a scanned photocopy: size 24-38 px, ink 15-75 grey on a grey ground of 175-235 lit unevenly
    (a linear gradient of up to 40 levels across the line), margins 4-14 px, turned by up to 1.5 degrees, shrunk
    to 55-90% and enlarged back (bilinear: a scanner's resolution), saved as a JPEG of quality 35-75; RGB
    uint8, and the text drawn (all of it)."""
    import io

    from PIL import Image, ImageDraw, ImageFont

    size = int(rng.integers(24, 39))
    font = ImageFont.truetype(str(font_file), size, layout_engine=ImageFont.Layout.RAQM)
    l, t, r, b = font.getbbox(text, language=LANGUAGE)
    mx, my = (int(v) for v in rng.integers(4, 15, 2))
    w, h = r - l + 2 * mx, b - t + 2 * my
    ground, ink = int(rng.integers(175, 236)), int(rng.integers(15, 76))
    glyphs = Image.new("L", (w, h), 0)
    ImageDraw.Draw(glyphs).text((mx - l, my - t), text, font=font, fill=255, language=LANGUAGE)
    light = ground + float(rng.uniform(-20, 20)) * np.linspace(-1, 1, w)[None, :]  # brighter to one side
    cover = np.asarray(glyphs, np.float32) / 255
    im = Image.fromarray(np.clip(light * (1 - cover) + ink * cover, 0, 255).astype(np.uint8)).convert("RGB")
    im = im.rotate(float(rng.uniform(-1.5, 1.5)), Image.Resampling.BICUBIC, expand=True, fillcolor=(ground,) * 3)
    k = float(rng.uniform(0.55, 0.9))
    small = (max(1, round(im.width * k)), max(1, round(im.height * k)))
    im = im.resize(small, Image.Resampling.BILINEAR).resize(im.size, Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=int(rng.integers(35, 76)))
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB")), text


def style_seeds(seed: int) -> tuple[int, int]:
    """(texts' seed, drawing's seed) of `styled`: streams of their own, so that a style's lines are not
    ocr_lines' own lines of the same seed cut short (a fine-tune on one and a check on the other share no
    texts by construction)."""
    a, b = np.random.SeedSequence([seed, 1]).generate_state(2)
    return int(a), int(b)


def styled(counts: tuple[int, int, int], keys: Sequence[str], style: str, seed: int = 0) -> Data:
    """`generated`'s counterpart for data.source ocr_lines_<style>: lines picked and drawn as `_DRAWN` says for
    that style, deterministic by seed."""
    _check_raqm(f"{BUILT_IN}_{style}")
    pick, draw, weight = _DRAWN[style]
    font_file = font_path(weight)
    total = sum(counts)
    text_seed, draw_seed = style_seeds(seed)
    rngs = np.random.default_rng(draw_seed).spawn(total)
    drawn = [draw(t, r, font_file) for t, r in zip(pick(keys, total, text_seed), rngs)]
    images, texts = [d[0] for d in drawn], [d[1] for d in drawn]
    a, b = counts[0], counts[0] + counts[1]
    return Data(Lines(images[:a], texts[:a]), Lines(images[a:b], texts[a:b]), Lines(images[b:], texts[b:]))


# each style (STYLES): how its texts are picked, how a line is drawn, Noto Sans CJK's weight it is drawn in.
# dot-matrix: short pieces (a date code); a scan: whole corpus lines as ocr_lines' (other texts: its own seed)
_DRAWN = {"dotmatrix": (short_lines, render_dotmatrix, "Regular"), "scan": (corpus_lines, render_scan, "Light")}


def _generated(counts: tuple[int, int, int], keys: Sequence[str], root: Path, style: str = "") -> Data:
    """`generated` (or `styled` for a style), cached: one .npz of the pixels (uint8, no pickle) and a JSON of
    texts and shapes per split count, key set and style, written atomically."""
    key = "\n".join(keys) + f"|{counts}|{_GENERATOR}" + (f"|{style}|{STYLES[style]}" if style else "")
    h = hashlib.sha256(key.encode()).hexdigest()[:16]
    base = root / (f"{BUILT_IN}_{style}" if style else BUILT_IN) / f"{counts[0]}-{counts[1]}-{counts[2]}-{h}"
    pixels, meta = base.with_suffix(".npz"), base.with_suffix(".json")
    if pixels.is_file() and meta.is_file():
        try:
            doc = json.loads(meta.read_text(encoding="utf-8"))
            with np.load(pixels, allow_pickle=False) as z:
                flat = z["pixels"]
            return _unflatten(flat, doc)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # a damaged cache is rebuilt
    data = styled(counts, keys, style) if style else generated(counts, keys)
    base.parent.mkdir(parents=True, exist_ok=True)
    flat, doc = _flatten(data)
    # one temporary name per process (users, tests and the bench share the cache), each file complete before
    # it is renamed into place; two writers of one key write the same bytes, so the renames may interleave
    tmp = {f: base.parent / f".{base.name}.{os.getpid()}.tmp{f.suffix}" for f in (pixels, meta)}
    try:
        with open(tmp[pixels], "wb") as f:
            np.savez(f, pixels=flat)
            f.flush()
            os.fsync(f.fileno())
        tmp[meta].write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp[pixels], pixels)
        os.replace(tmp[meta], meta)
    finally:
        for t in tmp.values():
            t.unlink(missing_ok=True)
    return data


def _flatten(data: Data) -> tuple[np.ndarray, dict[str, Any]]:
    doc: dict[str, Any] = {}
    parts = []
    for s in ("train", "val", "test"):
        lines: Lines = getattr(data, s)
        doc[s] = {"texts": lines.texts, "shapes": [list(i.shape) for i in lines.images]}
        parts += [i.reshape(-1) for i in lines.images]
    return np.concatenate(parts), doc


def _unflatten(flat: np.ndarray, doc: dict[str, Any]) -> Data:
    at, out = 0, {}
    for s in ("train", "val", "test"):
        images = []
        for shape in doc[s]["shapes"]:
            n = int(np.prod(shape))
            images.append(flat[at: at + n].reshape(shape))
            at += n
        out[s] = Lines(images, list(doc[s]["texts"]))
    if at != len(flat):
        raise ValueError("size")
    return Data(**out)
