"""Request bodies -> model input, refusing anything else with a fixed-schema error that never echoes input.

Content type (415), body cap on Content-Length and while reading, also after gzip (413), JSON nesting
depth before parsing, strict UTF-8 and RFC 8259 numbers (400); then the package's tensors (`spec.io`,
422): each input by name, its dtype, rank and fixed dims, every input present and one batch size
(`feeds`: iospec's one-line messages naming the input); base64 PNG/JPEG images of an image input decoded,
resized and normalised as at training time; text encoded by the training encoder with the package's
vocabulary and filling every input (`text_feeds`). Text packages feed every sample at max_len
(`canonical_ids`). What reaches the predictor is a dict of arrays by program name; /v1 also keeps each
image's original (height, width) before the resize (`v1_request`), so a task answering in pixels
(detection's boxes) answers in the sent image's. /v1's answer is the task's (`v1_answer`, `pipeline/tasks/`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import sys
import time
import zlib
from typing import Any

import numpy as np

from pipeline import data as data_mod, iospec
from pipeline.errors import InputError
from pipeline.serving.spec import Settings, Spec, TextSpec, limits_of

_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')  # deleted before the depth scan


class ApiError(Exception):
    """An HTTP error with the fixed schema; `message` never contains request content."""

    def __init__(self, code: int, kind: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code, self.kind, self.message, self.headers = code, kind, message, headers or {}


def error_body(code: int, kind: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "type": kind, "message": message}}


KINDS = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
          413: "body_too_large", 415: "unsupported_media_type", 422: "invalid_input", 500: "internal",
          503: "unavailable", 504: "timeout"}


def media_type(request: Any) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def read_body(request: Any, accepted: tuple[str, ...], s: Settings, deadline: float) -> bytes:
    """Content type (415; "" in `accepted`: none is fine too), then the size cap: on Content-Length before
    reading, and while reading (413)."""
    if media_type(request) not in accepted:
        named = " or ".join(a for a in accepted if a) + (" (or absent)" if "" in accepted else "")
        raise ApiError(415, "unsupported_media_type", f"Content-Type must be {named}")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise ApiError(415, "unsupported_media_type", "Content-Encoding must be gzip or absent")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > s.max_body_bytes):
        if not length.isdigit():
            raise ApiError(400, "bad_request", "invalid Content-Length")
        raise ApiError(413, "body_too_large", f"the body exceeds {s.max_body_bytes} bytes")

    async def read() -> bytes:
        chunks, n = [], 0
        async for chunk in request.stream():
            n += len(chunk)
            if n > s.max_body_bytes:
                raise ApiError(413, "body_too_large", f"the body exceeds {s.max_body_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        body = await asyncio.wait_for(read(), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        raise ApiError(408, "request_timeout", f"the body did not arrive within {s.timeout_s:g} s") from None
    if encoding == "gzip":
        body = _gunzip(body, s.max_body_bytes)
    return body


def _gunzip(body: bytes, cap: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, cap + 1)
    except zlib.error:
        raise ApiError(400, "bad_request", "the gzip body is corrupt") from None
    if len(out) > cap:
        raise ApiError(413, "body_too_large", f"the decompressed body exceeds {cap} bytes")
    if not d.eof:
        raise ApiError(400, "bad_request", "the gzip body is truncated")
    return out


def json_depth(body: bytes) -> int:
    """Deepest [/{ nesting outside strings, at C/numpy speed (no Python loop over the body).

    Escapes first: `\\\\` pairs, then `\\"`, removed left to right as JSON reads them; then only brackets
    and quotes are kept; a bracket is inside a string when an odd number of quotes precede it."""
    if b"\\" in body:  # most bodies (numbers, base64) have no escapes: skip two passes
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    residue = body.translate(None, _NOT_STRUCTURE)
    if not residue:
        return 0
    v = np.frombuffer(residue, np.uint8)
    quote = v == 0x22
    outside = (np.cumsum(quote, dtype=np.int32) & 1) == 0
    brackets = v[outside & ~quote]
    if not brackets.size:
        return 0
    steps = np.where((brackets == 0x5B) | (brackets == 0x7B), 1, -1).astype(np.int32)
    return int(np.cumsum(steps, dtype=np.int32).max())


def parse_json(body: bytes, max_depth: int) -> Any:
    """Strict UTF-8 JSON (RFC 8259: no NaN/Infinity, no number overflowing a double) with nesting
    <= max_depth, checked before parsing. orjson: 6x json.loads on float arrays (0.9 vs 5.9 ms for a
    3x64x64 input), which is most of what the event loop does per request."""
    import orjson

    # Nesting never exceeds the count of openers: most bodies (a /v2 tensor is one flat list) skip the scan.
    if body.count(b"[") + body.count(b"{") > max_depth and json_depth(body) > max_depth:
        raise ApiError(400, "invalid_json", f"JSON nested deeper than {max_depth} levels")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ApiError(400, "invalid_json", "the body is not valid UTF-8 JSON (NaN and Infinity are not JSON "
                                             "numbers)") from None


def sample_shape(spec: Spec, t: iospec.Tensor) -> tuple[int, ...]:
    """The per-sample shape input `t` is fed at: a text package's inputs always at max_len (`canonical_ids`)."""
    return (spec.text.max_len,) if spec.text is not None else tuple(t.shape[1:])


def expected(spec: Spec, s: Settings, t: iospec.Tensor) -> str:
    """What input `t` takes, in words (every message about a tensor ends with it)."""
    if spec.text is not None:
        text = spec.text
        return (f"int64 token ids: 1..{s.max_batch_size} rows of >= 1 ids each (each padded or truncated to "
                f"max_len {text.max_len}), ids 0..{_id_limit(spec, t) - 1}")
    dims = ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in bounds(spec, t))
    return f"{t.dtype} [N, {dims}] with 1 <= N <= {s.max_batch_size}"


def bounds(spec: Spec, t: iospec.Tensor) -> list[tuple[int, int]]:
    """(min, max) of each per-sample dim of input `t`: a fixed dim exactly, a task's dynamic one 1..its
    `sample_limits` (`spec.limits_of`)."""
    sample = sample_shape(spec, t)
    lim = limits_of(spec.task, spec.info) or sample
    return [(d, d) if d != -1 else (1, m) for d, m in zip(sample, lim)]


def _fits(spec: Spec, t: iospec.Tensor, shape: tuple[int, ...]) -> bool:
    """A sample shape against input `t` (`bounds`)."""
    b = bounds(spec, t)
    return len(shape) == len(b) and all(lo <= g <= hi for g, (lo, hi) in zip(shape, b))


def as_tensor(obj: Any, spec: Spec, s: Settings, t: iospec.Tensor, where: str) -> np.ndarray:
    """A JSON array (nested lists) -> input `t`'s dtype and shape, or 422 naming what was expected."""
    want = expected(spec, s, t)
    if spec.text is not None and _ragged(obj):
        return _ragged_ids(obj, spec, s, t, where)
    try:
        arr = np.asarray(obj)
    except (ValueError, TypeError, OverflowError):
        raise ApiError(422, "invalid_tensor", f"{where}: not a rectangular array; expected {want}") from None
    if arr.dtype.kind not in "iuf":
        raise ApiError(422, "invalid_tensor", f"{where}: must hold numbers only; expected {want}")
    return check_tensor(arr, spec, s, t, where)


def check_tensor(arr: np.ndarray, spec: Spec, s: Settings, t: iospec.Tensor, where: str) -> np.ndarray:
    """An array given for input `t` -> what the predictor is fed: its rank, fixed dims and batch size
    (1..max_batch_size), finite float32 or integers within the dtype (text: ids within the vocabulary, at
    max_len), or 422 naming what was expected."""
    if spec.text is not None:
        return _check_ids(arr, spec, s, t, where)
    want, sample = expected(spec, s, t), sample_shape(spec, t)
    if arr.ndim != len(sample) + 1:
        raise ApiError(422, "invalid_tensor", f"{where}: rank {arr.ndim}, expected {want}")
    if not _fits(spec, t, tuple(arr.shape[1:])) or not 1 <= arr.shape[0] <= s.max_batch_size:
        got = ", ".join(str(d) for d in arr.shape)
        raise ApiError(422, "invalid_tensor", f"{where}: shape [{got}], expected {want}")
    dtype = t.dtype
    if dtype == "float32":
        if arr.dtype.kind == "f" and arr.itemsize > 4:  # JSON's doubles: beyond float32 they become inf
            with np.errstate(over="ignore", invalid="ignore"):
                out = arr.astype(np.float32)
        else:  # binary float32 as it came (no copy), or integers (always within float32's range)
            out = arr.astype(np.float32, copy=False)
        if not np.isfinite(out).all():
            raise ApiError(422, "invalid_tensor", f"{where}: values must be finite float32 numbers")
        return out
    info = np.iinfo(dtype)
    arr = _integers(arr, where, want)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise ApiError(422, "invalid_tensor", f"{where}: values out of {dtype} range")
    return arr.astype(dtype)


def _integers(arr: np.ndarray, where: str, want: str) -> np.ndarray:
    """Integers, or integer-valued numbers written with a fraction (JSON Schema's integers include 1.0, and
    the OpenAPI schema says integer) as int64; such floats beyond int64 are refused, not wrapped."""
    if arr.dtype.kind in "iu":
        return arr
    if arr.dtype.kind != "f" or not (np.isfinite(arr).all() and (np.floor(arr) == arr).all()):
        raise ApiError(422, "invalid_tensor", f"{where}: must hold integers; expected {want}")
    if arr.size and (arr.min() < -2.0 ** 63 or arr.max() >= 2.0 ** 63):
        raise ApiError(422, "invalid_tensor", f"{where}: values out of int64 range")
    return arr.astype(np.int64)


def _check_ids(arr: np.ndarray, spec: Spec, s: Settings, t: iospec.Tensor, where: str) -> np.ndarray:
    """Token ids [N, L]: integers within the vocabulary (an id past the embedding table would read out of
    bounds in the predictor), then `canonical_ids`."""
    want, text = expected(spec, s, t), spec.text
    if arr.ndim != 2:
        raise ApiError(422, "invalid_tensor", f"{where}: rank {arr.ndim}, expected {want}")
    if not 1 <= arr.shape[0] <= s.max_batch_size or arr.shape[1] < 1:
        raise ApiError(422, "invalid_tensor", f"{where}: shape [{arr.shape[0]}, {arr.shape[1]}], expected {want}")
    return canonical_ids(_vocabulary_ids(arr, spec, t, where, want), text)


def _id_limit(spec: Spec, t: iospec.Tensor) -> int:
    """How many ids input `t` of a text package has: the vocabulary's, or ERNIE token types' (data.py)."""
    return data_mod.text_id_limits(spec.preprocessing, spec.text.vocab_size).get(t.public, spec.text.vocab_size)


def _vocabulary_ids(arr: np.ndarray, spec: Spec, t: iospec.Tensor, where: str, want: str) -> np.ndarray:
    arr, n = _integers(arr, where, want), _id_limit(spec, t)
    if arr.min() < 0 or arr.max() >= n:
        what = "the vocabulary" if n == spec.text.vocab_size else "the token types the model embeds"
        raise ApiError(422, "invalid_tensor", f"{where}: ids must be in 0..{n - 1} ({what})")
    return arr.astype(np.int64)


def _ragged(obj: Any) -> bool:
    return isinstance(obj, list) and all(isinstance(row, list) for row in obj) and len({len(r) for r in obj}) > 1


def _ragged_ids(rows: list[list[Any]], spec: Spec, s: Settings, t: iospec.Tensor, where: str) -> np.ndarray:
    """Token id rows of different lengths (texts are): each row checked, then truncated or padded to
    max_len on its own, as `canonical_ids` does to a rectangular [N, L]."""
    want, text = expected(spec, s, t), spec.text
    if len(rows) > s.max_batch_size:
        raise ApiError(422, "invalid_tensor", f"{where}: {len(rows)} rows, expected {want}")
    out = np.full((len(rows), text.max_len), text.pad_id, np.int64)
    for i, row in enumerate(rows):
        try:
            arr = np.asarray(row)
        except (ValueError, TypeError, OverflowError):
            raise ApiError(422, "invalid_tensor", f"{where}[{i}]: not a list of ids; expected {want}") from None
        if arr.ndim != 1 or not arr.size:
            raise ApiError(422, "invalid_tensor", f"{where}[{i}]: not a list of >= 1 ids; expected {want}")
        ids = _vocabulary_ids(arr, spec, t, f"{where}[{i}]", want)
        out[i, :min(ids.size, text.max_len)] = ids[:text.max_len]
    return out


def canonical_ids(ids: np.ndarray, text: TextSpec) -> np.ndarray:
    """[N, L] ids -> [N, max_len]: truncated, right-padded with pad_id, as `encode_texts` made the training
    data. Every text request is fed at max_len (not at the longest in its batch): text_cnn's max-pool and
    bigru's backward pass see the padding, so only a fixed width gives a sample the same output alone and
    in any batch (and the one shape oneDNN was warmed up on)."""
    n, length = ids.shape
    if length == text.max_len:
        return np.ascontiguousarray(ids)
    out = np.full((n, text.max_len), text.pad_id, np.int64)
    keep = min(length, text.max_len)
    out[:, :keep] = ids[:, :keep]
    return out


# ------------------------------------------------------------------ the package's tensors, by name

def names(tensors: tuple[iospec.Tensor, ...] | list[iospec.Tensor]) -> str:
    """'img', 'feat': the public names, as messages list what a model takes."""
    return ", ".join(repr(t.public) for t in tensors)


def find(tensors: tuple[iospec.Tensor, ...], name: Any) -> iospec.Tensor | None:
    """The tensor a request names, by its program or public name; None for anything else."""
    if isinstance(name, str):
        for t in tensors:
            if name == t.name or name == t.alias:
                return t
    return None


def feeds(arrays: dict[str, np.ndarray], spec: Spec, where: str = "request") -> dict[str, np.ndarray]:
    """Arrays by program name, each checked (`check_tensor`) -> the predictor's feeds: every input present,
    one batch size; else 422 with `iospec.IO.feeds`' one-line message naming the input and what it expected."""
    ins = spec.io.inputs
    if len(arrays) == len(ins) and len({len(a) for a in arrays.values()}) == 1:
        return arrays  # the keys are distinct inputs' names: all of them are there
    try:
        return spec.io.feeds(arrays, where)
    except InputError as e:
        kind = "invalid_request" if len(arrays) < len(ins) else "invalid_tensor"
        raise ApiError(422, kind, str(e)) from None


def _where(t: iospec.Tensor) -> str:
    return f"input {t.public!r}"


def text_feeds(ids: np.ndarray, spec: Spec) -> dict[str, np.ndarray]:
    """Encoded texts [N, max_len] -> every model input, by program name, made by the rule the package's
    preprocessing records (`data.text_inputs`, as training and export made them: one input `x` of the ids,
    or ERNIE's input_ids and a zero token_type_ids). 422 naming both sides if the rule makes other inputs
    than the model takes (`check_text_rule` refuses such a package at start)."""
    ins = spec.io.inputs
    try:
        made = data_mod.text_inputs(ids, spec.preprocessing)
    except InputError as e:
        raise ApiError(422, "invalid_request", str(e)) from None
    got = {t.name: made[k] for k in made if (t := find(ins, k)) is not None}
    if len(got) != len(ins) or len(made) != len(ins):
        raise ApiError(422, "invalid_request", f"the package's text rule makes inputs {', '.join(map(repr, made))}, "
                                               f"the model takes {names(ins)}; send 'inputs'")
    return got


def check_text_rule(spec: Spec) -> None:
    """InputError (one line) unless text fills every input of this text package (`text_feeds`)."""
    if spec.text is not None:
        try:
            text_feeds(np.zeros((1, spec.text.max_len), np.int64), spec)
        except ApiError as e:
            raise InputError(f"{spec.dir}: {e.message}") from None


def image_inputs(spec: Spec) -> list[iospec.Tensor]:
    """The inputs a base64 PNG/JPEG can fill: float32 NCHW images of 1 or 3 channels, normalised by their
    own preprocessing (`data.input_preprocessing`: per input, by public name); or the one input of a task
    that prepares images itself (`task_images`)."""
    if spec.text is not None:
        return []
    if task_images(spec):
        return [spec.io.inputs[0]]
    ins = spec.io.inputs
    try:
        per = data_mod.input_preprocessing(spec.preprocessing, [t.public for t in ins])
    except InputError:
        return []
    return [t for t in ins if per[t.public].get("kind") == "image" and per[t.public].get("layout") == "NCHW"
            and t.dtype == "float32" and len(t.shape) == 4 and t.shape[1] in (1, 3)
            and all(d >= 1 for d in t.shape[1:])]


def takes_images(spec: Spec) -> bool:
    return bool(image_inputs(spec))


def task_images(spec: Spec) -> bool:
    """Whether the package's task prepares images itself (a dynamic input: ocr_rec's lines, any width)."""
    from pipeline import tasks

    return tasks.dynamic(spec.task)


_FIELDS = {"inputs", "images", "text"}
INLINE_DECODE_BYTES = 48 << 10  # bytes of all images in a request (64 KiB of base64)
INLINE_DECODE_PIXELS = 256 * 256  # pixels of all images in a request, by their headers


def fields(spec: Spec) -> str:
    """The /v1 body's fields for this package, in words (each refusal of a body's shape says it)."""
    ins = spec.io.inputs
    if spec.text is not None:
        tensors = "token ids" if len(ins) == 1 else f"{{name: token ids}} for {names(ins)}"
        return f"'inputs' ({tensors}) or 'text' (strings)"
    if len(ins) == 1:
        return "'inputs' (tensors) or 'images' (base64 PNG/JPEG)"
    imgs = image_inputs(spec)
    return (f"'inputs' ({{name: tensor}} for {names(ins)})"
            + (f" and 'images' ({{name: [base64 PNG/JPEG]}} for {names(imgs)}), each input once" if imgs else ""))


def _by_name(field: str, value: Any, spec: Spec) -> dict[iospec.Tensor, Any]:
    """A field's value -> {input: its value}: an object of input name -> value, or (a package of one input)
    the value itself, as before names existed. Unknown names are refused without being echoed."""
    ins = spec.io.inputs
    if not isinstance(value, dict):
        if len(ins) == 1:
            return {ins[0]: value}
        raise ApiError(422, "invalid_request", f"{field}: an object of input name -> value; this model takes "
                                               f"{names(ins)}")
    out: dict[iospec.Tensor, Any] = {}
    for i, (key, v) in enumerate(value.items()):
        t = find(ins, key)
        if t is None:
            raise ApiError(422, "invalid_request", f"{field}: key {i + 1} is no input of this model; it takes "
                                                   f"{names(ins)}")
        if t in out:
            raise ApiError(422, "invalid_request", f"{field}: input {t.public!r} given twice")
        out[t] = v
    return out


Sizes = list[tuple[int, int]] | None  # each sample's original image (height, width); None: model-input pixels


async def v1_inputs(doc: Any, spec: Spec, s: Settings) -> dict[str, np.ndarray]:
    """A /v1/predict body -> the predictor's feeds by program name (`v1_request` without the sizes)."""
    return (await v1_request(doc, spec, s))[0]


async def v1_request(doc: Any, spec: Spec, s: Settings) -> tuple[dict[str, np.ndarray], Sizes]:
    """A /v1/predict body -> (the predictor's feeds by program name, each image's original (height, width)
    when images were sent, else None). `inputs` (tensors) and `images` (base64 PNG/JPEG of an image input) by
    input name, or, for a package of one input, as the bare value; `text` alone fills every input
    (`text_feeds`). Each input exactly once. Tensors are model inputs already (fixed dims checked, never
    resized): their sizes are None. Of several image inputs sent as images, the first one's sizes."""
    kinds = fields(spec)
    if not isinstance(doc, dict) or not doc or not set(doc) <= _FIELDS or ("text" in doc and len(doc) > 1):
        raise ApiError(422, "invalid_request", f"the body must be an object of {kinds}")
    if "text" in doc:
        if spec.text is None:
            raise ApiError(422, "invalid_request", f"this model does not take text; send {kinds}")
        return text_feeds(_encode_text(doc["text"], spec.text, s), spec), None
    tensors = _by_name("inputs", doc["inputs"], spec) if "inputs" in doc else {}
    images = _by_name("images", doc["images"], spec) if "images" in doc else {}
    both = next((t for t in images if t in tensors), None)
    if both is not None:
        raise ApiError(422, "invalid_request", f"input {both.public!r} is in both 'inputs' and 'images'; "
                                               f"send {kinds}")
    out = {t.name: as_tensor(v, spec, s, t, _where(t)) for t, v in tensors.items()}
    sizes: Sizes = None
    if images:
        decoded = await _images(images, spec, s, kinds)
        out.update({name: arr for name, (arr, _) in decoded.items()})
        sizes = next(iter(decoded.values()))[1]
    return feeds(out, spec), sizes


async def _images(images: dict[iospec.Tensor, Any], spec: Spec, s: Settings, kinds: str
                  ) -> dict[str, tuple[np.ndarray, list[tuple[int, int]]]]:
    takes = image_inputs(spec)
    for t, value in images.items():
        if t not in takes:
            if spec.text is not None:
                raise ApiError(422, "invalid_request", f"this model does not take images; send {kinds}")
            raise ApiError(422, "invalid_request", "this model takes tensors only ('inputs')" if not takes else
                           f"{_where(t)} is no image input (images fill {names(takes)}); send it in 'inputs'")
        if not isinstance(value, list) or not 1 <= len(value) <= s.max_batch_size \
                or not all(isinstance(im, str) for im in value):
            raise ApiError(422, "invalid_request", f"images: a list of 1..{s.max_batch_size} base64 strings")
    raws = {t: [_unbase64(b64, i) for i, b64 in enumerate(v)] for t, v in images.items()}
    # Decoding is CPU work. Small images decode on the event loop: a thread hand-off costs more than
    # decoding a 64x64 PNG and its GIL ping-pong slowed every batch (mobilenet at 3x64x64 under 16 clients:
    # 392 requests/s inline vs 322-352 with a thread, separate runs). Anything bigger, in bytes or in the
    # pixels its headers declare (a 16 kB PNG can hold 16 Mpx of zeros), goes to a thread so the loop
    # keeps answering.
    if inline_decode([r for rs in raws.values() for r in rs]):
        return _decode_all(raws, spec, s)
    return await asyncio.to_thread(_decode_all, raws, spec, s)


def _decode_all(raws: dict[iospec.Tensor, list[bytes]], spec: Spec, s: Settings
                ) -> dict[str, tuple[np.ndarray, list[tuple[int, int]]]]:
    return {t.name: _decode_images(rs, spec, s, t) for t, rs in raws.items()}


Groups = list[tuple[list[int], dict[str, np.ndarray]]]  # (positions in the request, feeds by program name)


async def v1_task_images(doc: Any, spec: Spec, s: Settings) -> tuple[Groups, list[tuple[int, int]]]:
    """A /v1/predict body of images for a task that prepares them (`task_images`): {"images": [base64
    PNG/JPEG, ...]} (or by input name) -> the task's batches (`prepare_images`), each of one shape and at
    most max_batch_size, with each batch's positions in the request; and each image's (height, width)."""
    t = spec.io.inputs[0]
    if not isinstance(doc, dict) or set(doc) != {"images"}:
        raise ApiError(422, "invalid_request", f"the body must be an object of {fields(spec)}")
    value = _by_name("images", doc["images"], spec)[t]
    if not isinstance(value, list) or not 1 <= len(value) <= s.max_batch_size \
            or not all(isinstance(im, str) for im in value):
        raise ApiError(422, "invalid_request", f"images: a list of 1..{s.max_batch_size} base64 strings")
    raws = [_unbase64(b64, i) for i, b64 in enumerate(value)]

    def prepare() -> tuple[Groups, list[tuple[int, int]]]:
        images = [_open_image(raw, i, s, "RGB", None)[0] for i, raw in enumerate(raws)]
        groups = [(pos, {t.name: x}) for pos, x in spec.task.prepare_images(images, spec.info, s.max_batch_size)]
        return groups, [(int(im.shape[0]), int(im.shape[1])) for im in images]

    return prepare() if inline_decode(raws) else await asyncio.to_thread(prepare)


def image_list(doc: Any, most: int) -> list[bytes]:
    """A body of {"images": [base64 PNG/JPEG, ...]} (1..`most`) -> the raw files; 422 naming the field otherwise."""
    if not isinstance(doc, dict) or set(doc) != {"images"}:
        raise ApiError(422, "invalid_request", "the body must be an object {\"images\": [base64 PNG/JPEG, ...]}")
    value = doc["images"]
    if not isinstance(value, list) or not 1 <= len(value) <= most or not all(isinstance(im, str) for im in value):
        raise ApiError(422, "invalid_request", f"images: a list of 1..{most} base64 strings")
    return [_unbase64(b64, i) for i, b64 in enumerate(value)]


def open_images(raws: list[bytes], s: Settings) -> list[np.ndarray]:
    """PNG/JPEG files -> RGB uint8 [H, W, 3] each, at their own size (the pixel cap checked); 422 naming images[i]."""
    return [_open_image(raw, i, s, "RGB", None)[0] for i, raw in enumerate(raws)]


def v1_answers(groups: Groups, outs: list[dict[str, np.ndarray]], spec: Spec, sizes: list[tuple[int, int]]
               ) -> dict[str, Any]:
    """Each batch's outputs -> one /v1 answer in the request's order: the task's answer per batch (with its
    images' original sizes, `sizes` in request order), whose every field is a list of one item per sample,
    put back at the samples' positions."""
    n = sum(len(pos) for pos, _ in groups)
    merged: dict[str, list[Any]] = {}
    for (pos, _), out in zip(groups, outs, strict=True):
        for key, items in v1_answer(out, spec, [sizes[p] for p in pos]).items():
            merged.setdefault(key, [None] * n)
            for p, item in zip(pos, items, strict=True):
                merged[key][p] = item
    return merged


def _unbase64(b64: str, i: int) -> bytes:
    """Strict base64 (the alphabet and padding only), what the OpenAPI schema's pattern says
    (`openapi.BASE64`). binascii's strict mode checks at C speed; base64.b64decode(validate=True) runs a
    regex over the string first (the server's top cost per image request after PIL's decoding, measured
    with py-spy). Both accept '=' beyond the padding ('AAAA=', 'AAAA==='): the length check refuses it."""
    try:
        if sys.version_info >= (3, 11):
            raw = binascii.a2b_base64(b64, strict_mode=True)
        else:
            raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or len(b64) != 4 * ((len(raw) + 2) // 3):
        raise ApiError(422, "invalid_image", f"images[{i}]: not valid base64")
    return raw


def inline_decode(raws: list[bytes]) -> bool:
    """Whether these images are small enough to decode on the event loop: at most INLINE_DECODE_BYTES
    in all and INLINE_DECODE_PIXELS by their headers (read without decoding the pixels)."""
    if sum(map(len, raws)) > INLINE_DECODE_BYTES:
        return False
    return sum(map(_declared_pixels, raws)) <= INLINE_DECODE_PIXELS


def _declared_pixels(raw: bytes) -> int:
    """Width x height from the header: a PNG's IHDR directly, anything else by PIL's lazy open; 0 for
    what is no image (_decode_images answers 422 at once, wherever it runs)."""
    if raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR" and len(raw) >= 24:
        return int.from_bytes(raw[16:20], "big") * int.from_bytes(raw[20:24], "big")
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            return im.width * im.height
    except Exception:
        return 0


def _encode_text(texts: Any, text: TextSpec, s: Settings) -> np.ndarray:
    """1..max_batch_size non-blank strings -> ids by the training encoder (truncated to max_len). The
    body was strict UTF-8 JSON (`parse_json`): no invalid bytes or lone surrogates reach this point.
    Strings are encoded as given (no stripping), as `encode_texts` encodes the training texts."""
    if not isinstance(texts, list) or not 1 <= len(texts) <= s.max_batch_size \
            or not all(isinstance(t, str) for t in texts):
        raise ApiError(422, "invalid_request", f"text: a list of 1..{s.max_batch_size} strings")
    for i, t in enumerate(texts):
        if not t.strip():  # as the text loaders refuse blank training texts
            raise ApiError(422, "empty_text", f"text[{i}]: empty (or only whitespace)")
    return text.encode(texts)


def _decode_images(raws: list[bytes], spec: Spec, s: Settings, t: iospec.Tensor
                   ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """PNG/JPEG files -> image input `t`: converted to its channels, resized to its size, prepared with its
    preprocessing, as at training time; and each file's own (height, width) before the resize."""
    c, h, w = t.shape[1:]
    out = np.empty((len(raws), c, h, w), np.uint8)
    sizes = []
    for i, raw in enumerate(raws):
        arr, size = _open_image(raw, i, s, "L" if c == 1 else "RGB", (w, h))
        sizes.append(size)
        out[i] = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    pre = data_mod.input_preprocessing(spec.preprocessing, [u.public for u in spec.io.inputs])[t.public]
    return data_mod.prepare(out, pre), sizes


def _open_image(raw: bytes, i: int, s: Settings, mode: str, size: tuple[int, int] | None
                ) -> tuple[np.ndarray, tuple[int, int]]:
    """One PNG/JPEG -> uint8 [H, W] ("L") or [H, W, 3] ("RGB"), resized to `size` (w, h) if given, and its
    own (height, width); 422 naming images[i] for anything else."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            if im.format not in ("PNG", "JPEG"):
                raise ApiError(422, "invalid_image", f"images[{i}]: must be PNG or JPEG")
            if im.width * im.height > s.max_image_pixels:
                raise ApiError(422, "invalid_image", f"images[{i}]: more than {s.max_image_pixels} pixels")
            if im.mode not in ("1", "L", "LA", "P", "RGB", "RGBA"):
                raise ApiError(422, "invalid_image", f"images[{i}]: unsupported image mode (need grayscale "
                                                      "or RGB)")
            own = (im.height, im.width)
            im = im.convert(mode) if im.mode != mode else im  # convert() to its own mode would copy it
            if size is not None and im.size != size:
                im = im.resize(size, Image.BILINEAR)  # as `data.image_size` does at training time
            return np.asarray(im, np.uint8), own
    except ApiError:
        raise
    except Exception:  # an untrusted file: any decoder failure is the sender's, never a 500
        raise ApiError(422, "invalid_image", f"images[{i}]: not a decodable PNG/JPEG") from None


def v1_answer(outs: dict[str, np.ndarray], spec: Spec, sizes: Sizes = None) -> dict[str, Any]:
    """The predictor's outputs (by program name) -> /v1's answer, the package's task's (`spec.task.answer`,
    on every output by public name, with serving.yaml's settings; `sizes`: each image's original (height,
    width), or None). Classification: each sample's label, its softmax score and the logits; a model of
    several outputs also gets every other one, by public name, under `outputs`. Detection:
    {"detections": [[{"label", "score", "box": [x1, y1, x2, y2]}, ...] per image]}, boxes in the sent
    image's pixels (model-input pixels for tensors)."""
    io_, info = spec.io, spec.info
    answer = spec.task.answer({t.public: outs[t.name] for t in io_.outputs}, info, sizes)
    if info.logits:
        others = {t.public: outs[t.name].tolist() for t in io_.outputs if t.public != info.logits}
        if others:
            answer["outputs"] = others
    return answer
