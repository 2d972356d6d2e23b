"""`pipe predict`'s inputs -> items, lazily (nothing held per item beyond the one being made).

What an INPUT may be: a file, a folder (walked recursively, sorted, by extension: IMAGE_EXTS and .pdf for an
image package, TEXT_EXTS for a text package), a glob (`scans/**/*.png`), or `@list.txt` (one path a line, blank
lines and `#` comments skipped; a relative path is relative to the list's folder). An item is one image file, one
page of a PDF, or one text of a text file: a line of .txt (blank lines skipped), the `--field` column of a .tsv
(with a header row), the `--field` member of each .jsonl object.

Each item is named by its source (the path as given or found), its page (PDF pages, 1-based) or line (texts,
1-based), and the sha256 of its content: an image file's bytes; a PDF's file (with the page number); a text's
UTF-8. Loading an item (`load_image`, `render_page`) checks the package's pixel limit before decoding: an image's
header declares its size (PIL reads only the header at open), a PDF page's size in points is read without
rendering it. What cannot be read becomes a `Problem` (an errors.jsonl row), never an exception out of here.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipeline import artifacts
from pipeline.errors import InputError

IMAGE_EXTS = (".png", ".jpg", ".jpeg")  # what /v1 decodes (PNG or JPEG)
PDF_EXT = ".pdf"
TEXT_EXTS = (".txt", ".tsv", ".jsonl")
MAX_FILE_BYTES = 1 << 30  # a file bigger than this is refused unread (an image's pixels are limited anyway)
MAX_LIST_LINES = 10_000_000
_PDF_LOCK = threading.Lock()  # pdfium is not thread-safe: every call into it holds this lock


@dataclass(frozen=True)
class Item:
    """One thing to predict: an image file, a PDF page, or a text. `sha256` is known up front for PDF pages and
    texts; an image's is computed when its bytes are read."""

    source: str
    kind: str  # "image", "page", "text"
    page: int | None = None
    line: int | None = None
    sha256: str | None = None
    text: str | None = None

    def key(self, sha256: str | None = None) -> tuple[str, int | None, int | None, str]:
        return (self.source, self.page, self.line, sha256 or self.sha256 or "")


@dataclass(frozen=True)
class Problem:
    """An item (or a whole source) that cannot be read: one errors.jsonl row."""

    source: str
    error: str
    page: int | None = None
    line: int | None = None
    sha256: str | None = None

    def key(self) -> tuple[str, int | None, int | None, str]:
        return (self.source, self.page, self.line, self.sha256 or "")


def expand(inputs: list[str], text: bool, field: str) -> Iterator[Item | Problem]:
    """Every item of the INPUT arguments, in order (folders sorted). A path given on the command line that is
    neither a file, a folder, a glob matching something nor a readable @list is refused (InputError) when
    reached; `check` finds these before anything runs."""
    for arg in inputs:
        for path in _paths(arg):
            yield from _items(path, text, field, explicit=arg == path)


def check(inputs: list[str]) -> None:
    """Refuse (one line) an INPUT that names nothing: a missing file, a glob without matches, an unreadable
    list. Nothing is read beyond the lists themselves."""
    if not inputs:
        raise InputError("INPUT: give at least one file, folder, glob or @list.txt")
    for arg in inputs:
        if arg.startswith("@"):
            _list_file(arg)
        elif not os.path.exists(arg) and not (glob.has_magic(arg) and next(glob.iglob(arg, recursive=True), None)):
            raise InputError(f"{arg}: no such file or folder" + (" (a glob matching nothing)" if glob.has_magic(arg)
                                                                 else ""))


def _list_file(arg: str) -> Path:
    p = Path(arg[1:])
    if not p.is_file():
        raise InputError(f"{arg}: no such list file {p}")
    return p


def _paths(arg: str) -> Iterator[str]:
    """An INPUT argument -> file or folder paths (a list's entries, a glob's sorted matches, itself)."""
    if arg.startswith("@"):
        p = _list_file(arg)
        with open(p, encoding="utf-8", errors="replace") as f:
            for n, raw in enumerate(f, 1):
                if n > MAX_LIST_LINES:
                    raise InputError(f"{p}: more than {MAX_LIST_LINES} lines")
                entry = raw.strip()
                if entry and not entry.startswith("#"):
                    yield entry if os.path.isabs(entry) else str(p.parent / entry)
    elif not os.path.exists(arg) and glob.has_magic(arg):
        yield from sorted(glob.iglob(arg, recursive=True))
    else:
        yield arg


def _items(path: str, text: bool, field: str, explicit: bool) -> Iterator[Item | Problem]:
    if os.path.isdir(path):
        exts = TEXT_EXTS if text else (*IMAGE_EXTS, PDF_EXT)
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if name.lower().endswith(exts):
                    yield from _items(os.path.join(root, name), text, field, explicit=False)
        return
    if not os.path.isfile(path):
        yield Problem(path, "no such file")
        return
    ext = os.path.splitext(path)[1].lower()
    if text:
        yield from _texts(path, ext, field)
    elif ext == PDF_EXT:
        yield from _pages(path)
    else:
        yield Item(path, "image")


def _texts(path: str, ext: str, field: str) -> Iterator[Item | Problem]:
    """A text file's texts: .txt lines, a .tsv's `field` column (header row), a .jsonl's `field` member."""
    if ext not in TEXT_EXTS:
        yield Problem(path, f"not a text file this package reads ({', '.join(TEXT_EXTS)})")
        return
    try:
        f = open(path, encoding="utf-8", newline="")
    except OSError as e:
        yield Problem(path, f"cannot read it ({e.strerror})")
        return
    with f:
        column = None
        try:
            for n, raw in enumerate(f, 1):
                line = raw.rstrip("\r\n")
                if ext == ".tsv":
                    cells = line.split("\t")
                    if column is None:
                        if field not in cells:
                            yield Problem(path, f"no column {field!r} in its header row (--field)")
                            return
                        column = cells.index(field)
                        continue
                    value = cells[column] if column < len(cells) else None
                elif ext == ".jsonl":
                    if not line.strip():
                        continue
                    try:
                        doc = json.loads(line)
                    except ValueError:
                        yield Problem(path, "not a JSON object", line=n)
                        continue
                    value = doc.get(field) if isinstance(doc, dict) else None
                else:
                    value = line
                if ext == ".txt" and not value.strip():
                    continue
                if not isinstance(value, str):
                    yield Problem(path, f"no text in field {field!r} (--field)", line=n)
                    continue
                yield Item(path, "text", line=n, sha256=hashlib.sha256(value.encode("utf-8")).hexdigest(), text=value)
        except UnicodeDecodeError:
            yield Problem(path, "not UTF-8 text")


def _pages(path: str) -> Iterator[Item | Problem]:
    """A PDF's pages, its sha256 computed once (a page is named by the file's sha256 and its number)."""
    import pypdfium2 as pdfium

    try:
        digest = artifacts.sha256_file(Path(path))
    except OSError as e:
        yield Problem(path, f"cannot read it ({e.strerror})")
        return
    with _PDF_LOCK:
        try:
            doc = pdfium.PdfDocument(path)
        except pdfium.PdfiumError as e:
            yield Problem(path, f"not a readable PDF ({_pdf_reason(e)})", sha256=digest)
            return
        try:
            n = len(doc)
        finally:
            doc.close()
    if n == 0:
        yield Problem(path, "a PDF without pages", sha256=digest)
    for p in range(1, n + 1):
        yield Item(path, "page", page=p, sha256=digest)


def _pdf_reason(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else e.__class__.__name__
    if "password" in msg.lower():
        return "encrypted: it needs a password"
    return msg[:200]


class Unreadable(Exception):
    """An item that cannot be read or breaks a limit: its message is the errors.jsonl row's `error`."""


def read_bytes(path: str) -> bytes:
    """A file's bytes, refusing what is too big to hold (Unreadable)."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise Unreadable(f"{size} bytes, more than the {MAX_FILE_BYTES} a file may have")
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise Unreadable(f"cannot read it ({e.strerror})") from None
    if not raw:
        raise Unreadable("an empty file (0 bytes)")
    return raw


def declared_pixels(raw: bytes, max_pixels: int) -> None:
    """Unreadable unless the image's header declares at most `max_pixels`: a PNG's IHDR read directly, anything
    else by PIL's open (which reads only the header; its own decompression-bomb refusal counts as too big)."""
    from PIL import Image

    if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and len(raw) >= 24:
        w, h = int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
    else:
        try:
            with Image.open(io.BytesIO(raw)) as im:
                w, h = im.size
        except Image.DecompressionBombError:
            raise Unreadable(f"its header claims more than the package's limit of {max_pixels} pixels") from None
        except Exception:
            raise Unreadable("not a decodable PNG/JPEG") from None
    if w * h > max_pixels:
        raise Unreadable(f"its header claims {w} x {h} pixels, more than the package's limit of {max_pixels}")


def render_page(item: Item, dpi: float, max_pixels: int) -> np.ndarray:
    """A PDF page rendered at `dpi` -> RGB uint8 [H, W, 3]; its size checked against `max_pixels` from the
    page's size in points before anything is rendered."""
    import pypdfium2 as pdfium

    scale = dpi / 72.0
    with _PDF_LOCK:
        try:
            doc = pdfium.PdfDocument(item.source)
        except pdfium.PdfiumError as e:
            raise Unreadable(f"not a readable PDF ({_pdf_reason(e)})") from None
        try:
            w_pt, h_pt = doc.get_page_size(item.page - 1)
            w, h = int(round(w_pt * scale)), int(round(h_pt * scale))
            if w * h > max_pixels:
                raise Unreadable(f"page {item.page} is {w} x {h} pixels at {dpi:g} dpi, more than the package's "
                                 f"limit of {max_pixels}")
            page = doc[item.page - 1]
            try:
                image = page.render(scale=scale).to_pil().convert("RGB")
            finally:
                page.close()
        except pdfium.PdfiumError as e:
            raise Unreadable(f"page {item.page} cannot be rendered ({_pdf_reason(e)})") from None
        finally:
            doc.close()
    return np.asarray(image, np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    """An RGB page as PNG bytes: what a model that resizes its input decodes, as /v1 decodes a sent PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def count(inputs: list[str], text: bool, field: str) -> int:
    """How many items (and problems) `expand` yields: the progress bar's total. A PDF's pages are counted by
    opening it (its page table only)."""
    return sum(1 for _ in expand(inputs, text, field))


def describe(x: Any) -> dict[str, Any]:
    """An item or problem's identity as a row has it."""
    out: dict[str, Any] = {"source": x.source, "page": x.page}
    if x.line is not None:
        out["line"] = x.line
    return out
