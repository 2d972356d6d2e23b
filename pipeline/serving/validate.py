"""Request bodies -> model input, refusing anything else with a fixed-schema error that never echoes input.

Content type (415), body cap on Content-Length and while reading, also after gzip (413), JSON nesting
depth before parsing, strict UTF-8 and RFC 8259 numbers (400); then the package's input spec (422):
dtype, rank and fixed dims of tensors; base64 PNG/JPEG images decoded, resized and normalised as at
training time; text encoded by the training encoder with the package's vocabulary. Text packages feed
every sample at max_len (`canonical_ids`).
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

from pipeline import data as data_mod
from pipeline.serving.spec import Settings, Spec, TextSpec

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

    if json_depth(body) > max_depth:
        raise ApiError(400, "invalid_json", f"JSON nested deeper than {max_depth} levels")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ApiError(400, "invalid_json", "the body is not valid UTF-8 JSON (NaN and Infinity are not JSON "
                                             "numbers)") from None


def expected(spec: Spec, s: Settings) -> str:
    if spec.text is not None:
        t = spec.text
        return (f"int64 token ids: 1..{s.max_batch_size} rows of >= 1 ids each (each padded or truncated to "
                f"max_len {t.max_len}), ids 0..{t.vocab_size - 1}")
    dims = ", ".join(str(d) for d in spec.sample_shape)
    return f"{spec.inp['dtype']} [N, {dims}] with 1 <= N <= {s.max_batch_size}"


def as_tensor(obj: Any, spec: Spec, s: Settings, where: str) -> np.ndarray:
    """A JSON array (nested lists) -> the model's dtype and shape, or 422 naming what was expected."""
    want = expected(spec, s)
    if spec.text is not None and _ragged(obj):
        return _ragged_ids(obj, spec, s, where)
    try:
        arr = np.asarray(obj)
    except (ValueError, TypeError, OverflowError):
        raise ApiError(422, "invalid_tensor", f"{where}: not a rectangular array; expected {want}") from None
    if arr.dtype.kind not in "iuf":
        raise ApiError(422, "invalid_tensor", f"{where}: must hold numbers only; expected {want}")
    return check_tensor(arr, spec, s, where)


def check_tensor(arr: np.ndarray, spec: Spec, s: Settings, where: str) -> np.ndarray:
    if spec.text is not None:
        return _check_ids(arr, spec, s, where)
    want, sample = expected(spec, s), spec.sample_shape
    if arr.ndim != len(sample) + 1:
        raise ApiError(422, "invalid_tensor", f"{where}: rank {arr.ndim}, expected {want}")
    if tuple(arr.shape[1:]) != sample or not 1 <= arr.shape[0] <= s.max_batch_size:
        got = ", ".join(str(d) for d in arr.shape)
        raise ApiError(422, "invalid_tensor", f"{where}: shape [{got}], expected {want}")
    dtype = spec.inp["dtype"]
    if dtype == "float32":
        with np.errstate(over="ignore", invalid="ignore"):
            out = arr.astype(np.float32)
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


def _check_ids(arr: np.ndarray, spec: Spec, s: Settings, where: str) -> np.ndarray:
    """Token ids [N, L]: integers within the vocabulary (an id past the embedding table would read out of
    bounds in the predictor), then `canonical_ids`."""
    want, t = expected(spec, s), spec.text
    if arr.ndim != 2:
        raise ApiError(422, "invalid_tensor", f"{where}: rank {arr.ndim}, expected {want}")
    if not 1 <= arr.shape[0] <= s.max_batch_size or arr.shape[1] < 1:
        raise ApiError(422, "invalid_tensor", f"{where}: shape [{arr.shape[0]}, {arr.shape[1]}], expected {want}")
    return canonical_ids(_vocabulary_ids(arr, t, where, want), t)


def _vocabulary_ids(arr: np.ndarray, t: TextSpec, where: str, want: str) -> np.ndarray:
    arr = _integers(arr, where, want)
    if arr.min() < 0 or arr.max() >= t.vocab_size:
        raise ApiError(422, "invalid_tensor", f"{where}: token ids must be in 0..{t.vocab_size - 1} (the vocabulary)")
    return arr.astype(np.int64)


def _ragged(obj: Any) -> bool:
    return isinstance(obj, list) and all(isinstance(row, list) for row in obj) and len({len(r) for r in obj}) > 1


def _ragged_ids(rows: list[list[Any]], spec: Spec, s: Settings, where: str) -> np.ndarray:
    """Token id rows of different lengths (texts are): each row checked, then truncated or padded to
    max_len on its own, as `canonical_ids` does to a rectangular [N, L]."""
    want, t = expected(spec, s), spec.text
    if len(rows) > s.max_batch_size:
        raise ApiError(422, "invalid_tensor", f"{where}: {len(rows)} rows, expected {want}")
    out = np.full((len(rows), t.max_len), t.pad_id, np.int64)
    for i, row in enumerate(rows):
        try:
            arr = np.asarray(row)
        except (ValueError, TypeError, OverflowError):
            raise ApiError(422, "invalid_tensor", f"{where}[{i}]: not a list of ids; expected {want}") from None
        if arr.ndim != 1 or not arr.size:
            raise ApiError(422, "invalid_tensor", f"{where}[{i}]: not a list of >= 1 ids; expected {want}")
        ids = _vocabulary_ids(arr, t, f"{where}[{i}]", want)
        out[i, :min(ids.size, t.max_len)] = ids[:t.max_len]
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


def takes_images(spec: Spec) -> bool:
    pre = spec.preprocessing
    return (pre.get("kind") == "image" and pre.get("layout") == "NCHW" and spec.inp["dtype"] == "float32"
            and len(spec.sample_shape) == 3 and spec.sample_shape[0] in (1, 3))


_FIELDS = {"inputs", "images", "text"}
INLINE_DECODE_BYTES = 48 << 10  # bytes of all images in a request (64 KiB of base64)
INLINE_DECODE_PIXELS = 256 * 256  # pixels of all images in a request, by their headers


async def v1_inputs(doc: Any, spec: Spec, s: Settings) -> np.ndarray:
    kinds = ("'inputs' (token ids) or 'text' (strings)" if spec.text is not None
             else "'inputs' (tensors) or 'images' (base64 PNG/JPEG)")
    if not isinstance(doc, dict) or len(doc) != 1 or not (_FIELDS & set(doc)):
        raise ApiError(422, "invalid_request", f"the body must be an object with exactly one field, {kinds}")
    if "inputs" in doc:
        return as_tensor(doc["inputs"], spec, s, "inputs")
    if "text" in doc:
        if spec.text is None:
            raise ApiError(422, "invalid_request", f"this model does not take text; send {kinds}")
        return _encode_text(doc["text"], spec.text, s)
    images = doc["images"]
    if not takes_images(spec):
        raise ApiError(422, "invalid_request", f"this model does not take images; send {kinds}"
                       if spec.text is not None else "this model takes tensors only ('inputs')")
    if not isinstance(images, list) or not 1 <= len(images) <= s.max_batch_size \
            or not all(isinstance(im, str) for im in images):
        raise ApiError(422, "invalid_request", f"images: a list of 1..{s.max_batch_size} base64 strings")
    raws = [_unbase64(b64, i) for i, b64 in enumerate(images)]
    # Decoding is CPU work. Small images decode on the event loop: a thread hand-off costs more than
    # decoding a 64x64 PNG and its GIL ping-pong slowed every batch (mobilenet at 3x64x64 under 16 clients:
    # 392 requests/s inline vs 322-352 with a thread, separate runs). Anything bigger, in bytes or in the
    # pixels its headers declare (a 16 kB PNG can hold 16 Mpx of zeros), goes to a thread so the loop
    # keeps answering.
    if inline_decode(raws):
        return _decode_images(raws, spec, s)
    return await asyncio.to_thread(_decode_images, raws, spec, s)


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


def _decode_images(raws: list[bytes], spec: Spec, s: Settings) -> np.ndarray:
    from PIL import Image

    c, h, w = spec.sample_shape
    out = np.empty((len(raws), c, h, w), np.uint8)
    for i, raw in enumerate(raws):
        try:
            with Image.open(io.BytesIO(raw)) as im:
                if im.format not in ("PNG", "JPEG"):
                    raise ApiError(422, "invalid_image", f"images[{i}]: must be PNG or JPEG")
                if im.width * im.height > s.max_image_pixels:
                    raise ApiError(422, "invalid_image", f"images[{i}]: more than {s.max_image_pixels} pixels")
                if im.mode not in ("1", "L", "LA", "P", "RGB", "RGBA"):
                    raise ApiError(422, "invalid_image", f"images[{i}]: unsupported image mode (need grayscale "
                                                          "or RGB)")
                im = im.convert("L" if c == 1 else "RGB")
                if im.size != (w, h):
                    im = im.resize((w, h), Image.BILINEAR)  # as `data.image_size` does at training time
                arr = np.asarray(im, np.uint8)
        except ApiError:
            raise
        except Exception:  # an untrusted file: any decoder failure is the sender's, never a 500
            raise ApiError(422, "invalid_image", f"images[{i}]: not a decodable PNG/JPEG") from None
        out[i] = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
    return data_mod.prepare(out, spec.preprocessing)


def v1_answer(y: np.ndarray, labels: list[str]) -> dict[str, Any]:
    z = y.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=1, keepdims=True)
    top = p.argmax(axis=1)
    return {"labels": [labels[i] for i in top], "scores": [float(p[r, i]) for r, i in enumerate(top)],
            "logits": y.tolist()}
