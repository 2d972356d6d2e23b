"""Object-detection data in COCO format: a seeded "shapes" generator and a strict reader.

Layout written by `generate` (and read):
    <root>/annotations/instances_train.json   required
    <root>/annotations/instances_val.json     optional
    <root>/annotations/instances_test.json    optional
    <root>/images/<file_name>                 each image's "file_name" is relative to images/

`read` also takes the other layouts people have (`LAYOUTS`: COCO 2017, Roboflow's export, a json beside each
split folder) or explicit paths per split (data.coco_{train,val,test}_json and _images); a split whose
annotation file is absent is carved out of train by pipeline/data.py.

Each json is standard COCO: `images` [{id, file_name, width, height}], `annotations` [{id, image_id,
category_id, bbox [x, y, w, h] in pixels from the top-left, area, iscrowd}], `categories` [{id, name}].
Every split file must have the same categories; class index = position in category-id order.
`iscrowd: 1` annotations are validated, then dropped. A missing `iscrowd` means 0; `area` is not read.
A box that runs past its image's edge is clipped to the image, and one left with no area (or given with w or
h 0) is dropped, as PaddleDetection's COCO reader did (its `with_background` version clipped; today's only
drops); both are counted in `CocoData.note`. Refused, naming the annotation: a box wholly outside its image,
a negative or non-finite size, an unknown image or category.
Ids are unique per file (image and annotation ids may repeat across split files; file names may not).
Sizes in messages are width x height.

    python -c "from pathlib import Path; from pipeline.tasks.detection import coco; coco.generate(Path('shapes'))"

No paddle here: numpy, PIL and json only.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from pipeline.errors import InputError

SHAPES = ("rectangle", "ellipse", "triangle")  # category ids 1, 2, 3
_SPLITS = ("train", "val", "test")
_GEN_VERSION = 1
_CACHE_VERSION = 1
_TOL = 1e-3  # px: a box sticking out by less is not counted as clipped (float round-off in exporters); an
# extent below it is no area
_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")
# The folder layouts people have, each split's (annotation file, image folder) relative to data.source; the
# first whose train annotation file exists is read. Val/test are optional (carved out of train when absent).
LAYOUTS = (
    ("annotations/instances_{train,val,test}.json + images/",
     {"train": ("annotations/instances_train.json", "images"), "val": ("annotations/instances_val.json", "images"),
      "test": ("annotations/instances_test.json", "images")}),
    ("COCO 2017: annotations/instances_{train,val}2017.json + train2017/, val2017/",
     {"train": ("annotations/instances_train2017.json", "train2017"),
      "val": ("annotations/instances_val2017.json", "val2017"),
      "test": ("annotations/instances_test2017.json", "test2017")}),
    ("Roboflow: {train,valid,test}/_annotations.coco.json beside the images",
     {"train": ("train/_annotations.coco.json", "train"), "val": ("valid/_annotations.coco.json", "valid"),
      "test": ("test/_annotations.coco.json", "test")}),
    ("a json beside each split folder: {train,val,test}.json + {train,val,test}/",
     {"train": ("train.json", "train"), "val": ("val.json", "val"), "test": ("test.json", "test")}),
)
_LAYOUT = "a COCO folder: " + "; or ".join(name for name, _ in LAYOUTS) + "; or data.coco_{train,val,test}_json/_images"


@dataclass(frozen=True)
class CocoData:
    """A COCO folder decoded: images resized to one size, boxes in that size's pixels."""

    images: np.ndarray  # uint8 (N, 3, H, W), RGB; H = W = image_size unless image_size is 0
    boxes: np.ndarray  # float32 (N, M, 5) [x1, y1, x2, y2, class_index]; padding rows [0, 0, 0, 0, -1]
    split: np.ndarray  # uint8 (N,): 0 train, 1 val, 2 test (the annotation file each image came from)
    sizes: np.ndarray  # int64 (N, 2): original (height, width)
    labels: tuple[str, ...]  # category names in category-id order
    category_ids: tuple[int, ...]  # the COCO ids, same order
    files: tuple[str, ...]  # file names relative to images/
    clipped: int = 0  # boxes that ran past their image's edge, clipped to it
    dropped: int = 0  # boxes with no area (after clipping), left out
    note: str = ""  # one line saying both, with the first of each; "" when neither happened


# ---------------------------------------------------------------- generate


def generate(root: Path, counts: tuple[int, int, int] = (2000, 300, 300), size: int = 64, seed: int = 0) -> None:
    """Write a seeded shapes dataset (train, val, test image counts) as a COCO folder at root, atomically.

    A root already generated with the same arguments is left as it is; a zero val/test count writes no file.
    """
    root = Path(root)
    counts = tuple(counts)
    if len(counts) != 3 or not all(_is_int(n) and n >= 0 for n in counts) or counts[0] < 1:
        raise InputError(f"coco.generate: counts must be 3 integers >= 0 with train >= 1, got {counts}")
    if not _is_int(size) or size < 16:
        raise InputError(f"coco.generate: size must be an integer >= 16, got {size}")
    params = {"generator": "pipe shapes", "version": _GEN_VERSION, "counts": list(counts), "size": size, "seed": seed}
    if _generated_with(root, params):
        return
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InputError(f"data.source {root}: exists and is not a shapes dataset with counts={list(counts)}, "
                         f"size={size}, seed={seed} (remove it or choose another path)")
    tmp = root.parent / f"{root.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_shapes(tmp, counts, size, seed)
        (tmp / "shapes.json").write_text(json.dumps(params, indent=1) + "\n")
        try:
            if root.is_dir():
                root.rmdir()  # an empty directory the caller made (another process may have filled it)
            os.replace(tmp, root)
        except OSError:
            if not _generated_with(root, params):  # else another process finished the same dataset first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _generated_with(root: Path, params: dict[str, Any]) -> bool:
    try:
        return json.loads((root / "shapes.json").read_text()) == params
    except (OSError, ValueError):
        return False


def _write_shapes(out: Path, counts: tuple[int, int, int], size: int, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    categories = [{"id": k + 1, "name": name} for k, name in enumerate(SHAPES)]
    image_id = ann_id = 0
    (out / "annotations").mkdir(parents=True)
    for split, n in zip(_SPLITS, counts):
        if n == 0:
            continue
        (out / "images" / split).mkdir(parents=True)
        images, anns = [], []
        for i in range(n):
            image_id += 1
            pixels, objects = _shapes_image(rng, size)
            name = f"{split}/{i:06d}.png"
            Image.fromarray(pixels).save(out / "images" / name, format="PNG")
            images.append({"id": image_id, "file_name": name, "width": size, "height": size})
            for cat, bbox, area in objects:
                ann_id += 1
                anns.append({"id": ann_id, "image_id": image_id, "category_id": cat, "bbox": bbox,
                             "area": area, "iscrowd": 0})
        doc = {"images": images, "annotations": anns, "categories": categories}
        (out / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc) + "\n")


def _shapes_image(rng: np.random.Generator, s: int) -> tuple[np.ndarray, list[tuple[int, list[int], int]]]:
    """One (s, s, 3) uint8 image and its objects [(category id, tight [x, y, w, h], mask pixels)]."""
    bg = _background(rng, s)
    img = bg.copy()
    lo, hi = s // 8, s // 2
    taken: list[tuple[int, int, int, int]] = []  # tight boxes, inclusive (x0, y0, x1, y1)
    objects = []
    for _ in range(int(rng.integers(1, 5))):
        # 30 candidate placements drawn at once; the first clear of the others is drawn
        kinds, orients = rng.integers(3, size=30), rng.integers(4, size=30)
        whs = rng.integers(lo, hi + 1, size=(30, 2))
        xys = (rng.random((30, 2)) * (s - whs + 1)).astype(int)
        for kind, orientation, (w, h), (x0, y0) in zip(kinds.tolist(), orients.tolist(), whs.tolist(), xys.tolist()):
            # the window holds the tight box, so a window 2 px clear of every box keeps boxes 2 px apart
            if any(x0 <= t[2] + 2 and t[0] <= x0 + w + 1 and y0 <= t[3] + 2 and t[1] <= y0 + h + 1 for t in taken):
                continue
            mask = _mask(kind, w, h, orientation)
            rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
            box = (x0 + int(cols[0]), y0 + int(rows[0]), x0 + int(cols[-1]), y0 + int(rows[-1]))
            window = img[y0:y0 + h, x0:x0 + w]
            window[mask] = _colour(rng, bg[y0:y0 + h, x0:x0 + w].reshape(-1, 3))
            taken.append(box)
            objects.append((kind + 1, [box[0], box[1], box[2] - box[0] + 1, box[3] - box[1] + 1], int(mask.sum())))
            break
    img += rng.standard_normal(img.shape, dtype=np.float32) * 4.0
    return np.clip(np.rint(img), 0, 255).astype(np.uint8), objects


def _background(rng: np.random.Generator, s: int) -> np.ndarray:
    """float32 (s, s, 3): a random two-colour gradient plus a smooth random texture."""
    from PIL import Image

    c0, c1 = rng.uniform(0, 255, (2, 3)).astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    xx, yy = _grid(s, s)
    t = xx * np.float32(np.cos(angle)) + yy * np.float32(np.sin(angle))
    t = (t - t.min()) / (t.max() - t.min())
    grid = rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)
    texture = np.asarray(Image.fromarray(grid).resize((s, s), Image.BILINEAR), np.float32)
    return np.clip(c0 + (c1 - c0) * t[..., None] + (texture - 127.5) * 0.25, 0, 255)


@functools.lru_cache(maxsize=1024)
def _grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 (h, w) x and y of pixel centres (read-only, shared)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32) + 0.5
    xx.flags.writeable = yy.flags.writeable = False
    return xx, yy


def _mask(kind: int, w: int, h: int, orientation: int) -> np.ndarray:
    """bool (h, w): pixel centres inside a rectangle, ellipse or triangle filling the w x h window."""
    px, py = _grid(h, w)
    if kind == 0:
        return np.ones((h, w), bool)
    if kind == 1:
        return ((px - w / 2) / (w / 2)) ** 2 + ((py - h / 2) / (h / 2)) ** 2 <= 1.0
    corners = {0: ((w / 2, 0), (w, h), (0, h)), 1: ((0, 0), (w, 0), (w / 2, h)),  # apex up, down
               2: ((0, h / 2), (w, 0), (w, h)), 3: ((0, 0), (w, h / 2), (0, h))}[orientation]  # left, right
    sides = []
    for (ax, ay), (bx, by) in zip(corners, corners[1:] + corners[:1]):
        sides.append((bx - ax) * (py - ay) - (by - ay) * (px - ax))
    return np.all([d >= 0 for d in sides], axis=0) | np.all([d <= 0 for d in sides], axis=0)


def _colour(rng: np.random.Generator, bg: np.ndarray) -> np.ndarray:
    """A random RGB colour at least 100 (euclidean) from every background pixel under the object."""
    for _ in range(50):
        c = rng.integers(0, 256, 3).astype(np.float64)
        if np.sqrt(((bg - c) ** 2).sum(1)).min() >= 100:
            return c
    return np.where(bg.mean(0) < 128, 255.0, 0.0)  # the cube corner opposite the local mean


# ---------------------------------------------------------------- read


@dataclass
class _Image:
    id: int
    file: str
    width: int
    height: int
    split: int
    source: Path  # its annotation file
    dir: Path  # the folder its file_name is relative to
    first_ann: int | None = None
    boxes: list[tuple[float, float, float, float, int]] = field(default_factory=list)  # x1, y1, x2, y2, category id


def layout(root: Path, explicit: dict[str, tuple[str, str]] | None = None) -> dict[str, tuple[Path, Path]]:
    """split -> (annotation file, image folder) of the COCO folder at root: the first of `LAYOUTS` whose train
    annotation file exists, or `explicit` paths (data.coco_*: relative to root, or absolute; a split given needs
    its annotation file, and train is always given); only splits whose annotation file exists, train always.
    Each image folder must exist."""
    root = Path(root)
    given = {s: (a, i) for s, (a, i) in (explicit or {}).items() if a or i}
    if given:
        for s, (a, i) in given.items():  # a half-given split would be ignored silently: refuse it
            if not a:
                raise InputError(f"data.coco_{s}_images {i}: needs data.coco_{s}_json (the annotation file of the "
                                 "images in that folder)")
        if "train" not in given:
            s = next(iter(given))
            raise InputError(f"data.coco_{s}_json {given[s][0]}: needs data.coco_train_json too (explicit paths "
                             "name the train split's annotation file)")
        found = {s: (root / a, root / (i or ".")) for s, (a, i) in given.items()}
        for s, (a, i) in found.items():
            if not a.is_file():
                raise InputError(f"data.coco_{s}_json {a}: no such file")
            if not i.is_dir():
                raise InputError(f"data.coco_{s}_images {i}: no such folder")
        return found
    for _, splits in LAYOUTS:
        if (root / splits["train"][0]).is_file():
            found = {s: (root / a, root / i) for s, (a, i) in splits.items() if (root / a).is_file()}
            for s, (a, i) in found.items():
                if not i.is_dir():
                    raise InputError(f"data.source {i}: no such folder (the images of {a.relative_to(root)})")
            return found
    raise InputError(f"data.source {root}: no COCO train annotations found; looked for {_LAYOUT}")


def is_coco_document(path: Path) -> bool:
    """Whether the file is a JSON object with "images" and "annotations" (a test of intent, not validation)."""
    try:
        doc = json.loads(Path(path).read_bytes())
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return False
    return isinstance(doc, dict) and "images" in doc and "annotations" in doc


def read(root: Path, image_size: int, cache_dir: Path | None = None,
         explicit: dict[str, tuple[str, str]] | None = None) -> CocoData:
    """Validate and decode the COCO folder at root (`layout`); images resized to image_size (0: keep, all
    must match).

    Decoded images are cached in `cache_dir/coco-<key>.npy` (key: the json and image bytes, image_size);
    None decodes without caching. Nothing is written when the folder is invalid.
    """
    root = Path(root)
    if not _is_int(image_size) or image_size < 0:
        raise InputError(f"data.image_size: must be an integer >= 0, got {image_size!r}")
    found = layout(root, explicit)
    train = found["train"][0]
    raws: list[tuple[str, bytes]] = []
    fixes: dict[str, list[str]] = {"clipped": [], "dropped": []}  # per kind, "<file> annotation <id>, <what>"
    images: list[_Image] = []
    cats: list[tuple[int, str]] = []
    owner: dict[Path, _Image] = {}
    for k, name in enumerate(_SPLITS):
        if name not in found:
            continue
        path, folder = found[name]
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise InputError(f"data.source {path}: cannot read ({e.strerror})") from None
        file_cats, file_images, file_fixes = _parse(path, raw, k, folder)
        if k and file_cats != cats:
            raise InputError(f"data.source {path}: categories ({_cat_list(file_cats)}) differ from "
                             f"{train}'s ({_cat_list(cats)})")
        cats = file_cats
        for im in file_images:
            key = (im.dir / im.file).resolve()
            if key in owner:
                other = owner[key]
                raise _image_error(im, f"is also image {other.id} of {other.source.name} (an image is in one split)")
            owner[key] = im
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        raws.append((rel, raw))
        for kind, what in file_fixes:
            fixes[kind].append(f"{rel} {what}")
        images += file_images
    if not images:
        raise InputError(f"data.source {train}: no images")
    if image_size == 0:
        shapes = {(im.width, im.height): im for im in images}
        if len(shapes) > 1:
            a, b = list(shapes.values())[:2]
            raise InputError(f"data.source {root}: images differ in size ({a.dir.name}/{a.file} is {a.width}x{a.height}, "
                             f"{b.dir.name}/{b.file} is {b.width}x{b.height}); set data.image_size to resize them")
    pixels = _pixels(root, images, image_size, raws, cache_dir)
    return CocoData(images=pixels, boxes=_boxes(images, [c for c, _ in cats], image_size),
                    split=np.array([im.split for im in images], np.uint8),
                    sizes=np.array([(im.height, im.width) for im in images], np.int64),
                    labels=tuple(n for _, n in cats), category_ids=tuple(c for c, _ in cats),
                    files=tuple(im.file for im in images), clipped=len(fixes["clipped"]),
                    dropped=len(fixes["dropped"]), note=_fix_note(root, fixes))


def _fix_note(root: Path, fixes: dict[str, list[str]]) -> str:
    """One line counting the clipped and the dropped boxes, naming the first of each."""
    said = []
    for kind, what in (("clipped", "past the image edge clipped to it"),
                       ("dropped", "with no area after clipping dropped")):
        n = len(fixes[kind])
        if n:
            said.append(f"{n} box{'es' if n > 1 else ''} {what} (first: {fixes[kind][0]})")
    return f"data.source {root}: " + "; ".join(said) if said else ""


def _boxes(images: list[_Image], cat_ids: list[int], size: int) -> np.ndarray:
    index = {c: k for k, c in enumerate(cat_ids)}
    out = np.zeros((len(images), max(1, max(len(im.boxes) for im in images)), 5), np.float32)
    out[:, :, 4] = -1
    for i, im in enumerate(images):
        if not im.boxes:
            continue
        b = np.array([bx[:4] for bx in im.boxes], np.float64)  # clipped to the image by _parse
        sx, sy = (size / im.width, size / im.height) if size else (1.0, 1.0)
        out[i, :len(b), :4] = b * [sx, sy, sx, sy]
        out[i, :len(b), 4] = [index[bx[4]] for bx in im.boxes]
    return out


# ---------------------------------------------------------------- json validation


def _parse(path: Path, raw: bytes, split: int, folder: Path
           ) -> tuple[list[tuple[int, str]], list[_Image], list[tuple[str, str]]]:
    """The categories [(id, name)] in id order, the images with their boxes clipped to the image, and what the
    clipping did [("clipped" or "dropped", "annotation <id>, <box> in image <id> (WxH)...")], of one split file."""
    where = f"data.source {path}"
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InputError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise InputError(f"{where}: not UTF-8 text") from None
    if not isinstance(doc, dict):
        raise InputError(f"{where}: top level is not an object (a COCO file has images, annotations and categories)")
    for key in ("images", "annotations", "categories"):
        if key not in doc:
            raise InputError(f'{where}: missing "{key}" (a COCO file has images, annotations and categories)')
        if not isinstance(doc[key], list):
            raise InputError(f'{where}: "{key}" must be a list, got {_show(doc[key])}')
    cats: dict[int, str] = {}
    for i, c in enumerate(doc["categories"]):
        tag = _entry(where, "categories", "category", i, c, ("name",))
        if c["id"] in cats:
            raise InputError(f"{where}: category id {c['id']} appears twice")
        if not isinstance(c["name"], str) or not c["name"].strip() or not c["name"].isprintable():
            raise InputError(f'{where}: {tag}: "name" must be a non-empty printable string, got {_show(c["name"])}')
        if c["name"] in cats.values():
            raise InputError(f"{where}: {tag}: name {_show(c['name'])} is also another category's")
        cats[c["id"]] = c["name"]
    if not cats:
        raise InputError(f"{where}: no categories")
    by_id: dict[int, _Image] = {}
    names: dict[str, int] = {}
    for i, e in enumerate(doc["images"]):
        tag = _entry(where, "images", "image", i, e, ("file_name", "width", "height"))
        if e["id"] in by_id:
            raise InputError(f"{where}: image id {e['id']} appears twice")
        for key in ("width", "height"):
            if not _is_int(e[key]) or e[key] <= 0:
                raise InputError(f'{where}: {tag}: "{key}" must be a positive integer, got {_show(e[key])}')
        name = e["file_name"]
        if not _safe_name(name):
            raise InputError(f'{where}: {tag}: "file_name" {_show(name)} must be a relative path inside {folder.name}/')
        if name in names:
            raise InputError(f"{where}: {tag}: {folder.name}/{name} is also image {names[name]}")
        names[name] = e["id"]
        by_id[e["id"]] = _Image(e["id"], name, e["width"], e["height"], split, path, folder)
    ann_ids: set[int] = set()
    fixes: list[tuple[str, str]] = []
    known = ", ".join(str(c) for c in sorted(cats))
    for i, a in enumerate(doc["annotations"]):
        tag = _entry(where, "annotations", "annotation", i, a, ("image_id", "category_id", "bbox"))
        if a["id"] in ann_ids:
            raise InputError(f"{where}: annotation id {a['id']} appears twice")
        ann_ids.add(a["id"])
        im = by_id.get(a["image_id"]) if _is_int(a["image_id"]) else None
        if im is None:
            raise InputError(f"{where}: {tag}: image_id {_show(a['image_id'])} is not in images")
        if not _is_int(a["category_id"]) or a["category_id"] not in cats:
            raise InputError(f"{where}: {tag}: unknown category_id {_show(a['category_id'])} (categories: {known})")
        crowd = a.get("iscrowd", 0)
        if not _is_int(crowd) or crowd not in (0, 1):
            raise InputError(f'{where}: {tag}: "iscrowd" must be 0 or 1, got {_show(crowd)}')
        b = a["bbox"]
        if not isinstance(b, list) or len(b) != 4 or not all(_is_number(v) for v in b):
            raise InputError(f'{where}: {tag}: "bbox" must be 4 finite numbers [x, y, w, h], got {_show(b)}')
        x, y, w, h = (float(v) for v in b)
        shown = _box(b)
        if w < 0 or h < 0:
            raise InputError(f"{where}: {tag}: box {shown} has a negative size (w and h must be >= 0)")
        # wholly outside: apart from the image by more than round-off (a box touching an edge has no area left)
        if x > im.width + _TOL or y > im.height + _TOL or x + w < -_TOL or y + h < -_TOL:
            raise InputError(f"{where}: {tag}: box {shown} lies outside image {im.id} ({im.width}x{im.height})")
        if im.first_ann is None:
            im.first_ann = a["id"]
        if crowd:
            continue
        x1, y1 = min(max(x, 0.0), im.width), min(max(y, 0.0), im.height)
        x2, y2 = min(max(x + w, 0.0), im.width), min(max(y + h, 0.0), im.height)
        what = f"annotation {a['id']}, {shown} in image {im.id} ({im.width}x{im.height})"
        if x2 - x1 < _TOL or y2 - y1 < _TOL:
            fixes.append(("dropped", what))
            continue
        if x < -_TOL or y < -_TOL or x + w > im.width + _TOL or y + h > im.height + _TOL:
            fixes.append(("clipped", f"{what} -> {_box([x1, y1, x2 - x1, y2 - y1])}"))
        im.boxes.append((x1, y1, x2, y2, a["category_id"]))
    return sorted(cats.items()), list(by_id.values()), fixes


def _entry(where: str, key: str, kind: str, i: int, e: Any, fields: tuple[str, ...]) -> str:
    """`e`'s label ("annotation 17") once it is an object with an integer id and `fields`."""
    if not isinstance(e, dict):
        raise InputError(f"{where}: {key}[{i}] is not an object, got {_show(e)}")
    if "id" not in e:
        raise InputError(f'{where}: {key}[{i}]: missing "id"')
    if not _is_int(e["id"]):
        raise InputError(f'{where}: {key}[{i}]: "id" must be an integer, got {_show(e["id"])}')
    tag = f"{kind} {e['id']}"
    for f in fields:
        if f not in e:
            raise InputError(f'{where}: {tag}: missing "{f}"')
    return tag


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _safe_name(name: Any) -> bool:
    if not isinstance(name, str) or not name or not name.isprintable() or "\\" in name:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and ".." not in p.parts and p.name not in ("", ".")


def _box(b: list[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in b) + "]"


def _show(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=True)
    return s if len(s) <= 60 else s[:57] + "..."


def _cat_list(cats: list[tuple[int, str]]) -> str:
    return ", ".join(f"{c} {n}" for c, n in cats)


def _image_error(im: _Image, what: str) -> InputError:
    ann = f" (annotation {im.first_ann})" if im.first_ann is not None else ""
    return InputError(f"data.source {im.source}: image {im.id}{ann}: {im.dir.name}/{im.file} {what}")


# ---------------------------------------------------------------- pixels and cache


def _pixels(root: Path, images: list[_Image], size: int, raws: list[tuple[str, bytes]],
            cache_dir: Path | None) -> np.ndarray:
    """uint8 (N, 3, H, W), from the cache when its key matches, else decoded (and cached)."""
    h = hashlib.sha256(json.dumps({"v": _CACHE_VERSION, "image_size": size}).encode())
    for name, raw in raws:
        h.update(name.encode() + b"\0" + hashlib.sha256(raw).digest())
    for im in images:
        path = im.dir / im.file
        if not path.is_file():
            raise _image_error(im, "is missing")
        try:
            h.update(hashlib.sha256(path.read_bytes()).digest())
        except OSError as e:
            raise _image_error(im, f"cannot be read ({e.strerror})") from None
    shape = (len(images), 3, size or images[0].height, size or images[0].width)
    final = Path(cache_dir) / f"coco-{h.hexdigest()[:24]}.npy" if cache_dir is not None else None
    if final is not None and final.is_file():
        cached = np.load(final, mmap_mode="r")
        if cached.shape == shape and cached.dtype == np.uint8:
            return cached
    for im in images:  # headers only: every remaining check before anything is written
        _check_header(im.dir / im.file, im)
    if final is None:
        out = np.empty(shape, np.uint8)
        for i, im in enumerate(images):
            out[i] = _decode(im.dir / im.file, im, size)
        return out
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{final.stem}.tmp-{os.getpid()}.npy"
    try:
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
        for i, im in enumerate(images):
            arr[i] = _decode(im.dir / im.file, im, size)
        arr.flush()
        del arr
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return np.load(final, mmap_mode="r")


def _check_header(path: Path, im: _Image) -> None:
    from PIL import Image

    try:
        with Image.open(path) as pil:
            fmt, (w, h), mode = pil.format, pil.size, pil.mode
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise _image_error(im, "is not a readable PNG/JPEG image") from None
    if fmt not in ("PNG", "JPEG"):
        raise _image_error(im, f"is not a readable PNG/JPEG image (it is {fmt})")
    if mode not in _MODES:
        raise _image_error(im, f"has unsupported image mode {mode} (need grayscale or RGB)")
    if (w, h) != (im.width, im.height):
        raise _image_error(im, f"is {w}x{h}, the file says {im.width}x{im.height}")


def _decode(path: Path, im: _Image, size: int) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as pil:
            rgb = pil.convert("RGB")
            if size:
                rgb = rgb.resize((size, size), Image.BILINEAR)
            arr = np.asarray(rgb, np.uint8)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise _image_error(im, "is not a readable PNG/JPEG image") from None
    return arr.transpose(2, 0, 1)
