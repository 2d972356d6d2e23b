"""Starting weights for fine-tuning: `model.init` (`pipe train --init PATH`).

    pipe train --config examples/digits.yaml --run runs/ft --init runs/exp1/train

A source is a `.safetensors` or `.pdparams` state dict, an earlier run's `train/` artifact (verified
first, then its `model.safetensors`), or a `pipe import`'s export artifact (kind `program`: the imported
program itself, legacy or PIR, becomes the model, pipeline/nets/program_layer.py; pipeline/trainer.py builds it, not `apply`). Tensors are matched by name to the built model's `state_dict()`;
one whose shape differs (a new classifier head for another class count), or whose dtype differs where
either side is not floating point, keeps its fresh init. `model.init_strict` refuses any difference.

A `.pdparams` is a pickle, and `paddle.load` on a crafted one runs its payload (RELIABILITY.md §6). It
is read by `_Restricted`, pipe's one unpickler: its `find_class` admits only the globals that
`paddle.save(state_dict, "x.pdparams")` writes (Paddle 3.3.1, numpy 1.26: protocol 4 by default, each
tensor a numpy array rebuilt by `numpy.core.multiarray._reconstruct(numpy.ndarray, ...)` with a
`numpy.dtype`; protocol 2 also writes bytes as `_codecs.encode(str, "latin1")`). Any other global is
refused before it is looked up, so nothing of the file runs.
"""

from __future__ import annotations

import hashlib
import io
import pickle  # for _Restricted only: the one unpickler in pipe (tests/test_security.py)
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, runtime
from pipeline.errors import InputError
from pipeline.progress import Emit

_SHOWN = 4  # names per kind in the one-line report; the manifest keeps them all
_PADDLE_META = "StructuredToParameterName@@"  # paddle.save's name map, dropped by paddle.load too


@dataclass(frozen=True)
class Source:
    """A checked `model.init`: `file` is the state dict to read."""

    path: Path
    kind: str  # "train", "safetensors", "pdparams" or "program" (a pipe import's export artifact)
    file: Path
    manifest_sha256: str | None = None  # kind "train" or "program": the artifact's manifest
    manifest: dict[str, Any] | None = None  # kind "program": that manifest, verified (read it, do not verify again)


def source(spec: str) -> Source:
    """Check `model.init` before anything is built or written: a train artifact that verifies, or an
    existing `.safetensors` / `.pdparams` file. Reads no tensor and imports no paddle."""
    path = Path(spec)
    if path.is_dir():
        try:
            art = artifacts.verify(path, ("train", "export"))
        except InputError as e:
            raise InputError(f"model.init: {e}") from None
        if art.stage == "export":
            return _program(art)
        return Source(path, "train", art.file("model.safetensors"), art.manifest_sha256)
    if not path.exists():
        raise InputError(f"model.init {path}: no such file or directory")
    if path.suffix not in (".safetensors", ".pdparams"):
        raise InputError(f"model.init {path}: expected a .safetensors or .pdparams state dict, or a train "
                         "artifact directory")
    return Source(path, path.suffix[1:], path)


def _program(art: artifacts.Artifact) -> Source:
    """An export artifact as `model.init`: a pipe import (someone's exported program, e.g. PP-OCRv4 rec) whose
    program, legacy or PIR (`program_files`), pipe train runs as a layer (pipeline/nets/program_layer.py). pipe's own
    exports are refused: their train artifact is the better start."""
    where = f"model.init {art.path}"
    lineage = art.manifest.get("source") or {}
    if lineage.get("kind") not in ("import", "finetune"):
        raise InputError(f"{where}: a pipe export of a model pipe trained; fine-tune from its train/ artifact "
                         f"(the export's lineage names it)")
    _, params = program_files(art.manifest)
    return Source(art.path, "program", art.file(params), art.manifest_sha256, art.manifest)


def program_files(manifest: dict[str, Any]) -> tuple[str, str]:
    """(program, params) of an import's export artifact that pipe train runs as a layer: the legacy program
    when the import has one (`legacy/model.pdmodel`), else the PIR program it was imported from, copied as
    given (`model.json`: a PaddleOCR 3.x / PaddleX 3 export's inference.json)."""
    legacy = manifest.get("legacy") or {}
    if legacy.get("format") == "legacy":
        return str(legacy["model"]), str(legacy["params"])
    return "model.json", "model.pdiparams"


def apply(paddle: Any, net: Any, src: Source, strict: bool, emit: Emit) -> dict[str, Any]:
    """Copy `src`'s tensors into `net` (freshly built, not yet wrapped) by name; say what matched in one
    line through `emit`. Returns the manifest's `init` record."""
    where = f"model.init {src.path}"
    values, sha = _read(paddle, src)
    model = net.state_dict()
    loaded, mismatch, details = [], [], {}
    for name, param in model.items():
        if name not in values:
            continue
        why = _difference(values[name], param)
        if why:
            mismatch.append(name)
            details[name] = why
        else:
            loaded.append(name)
    missing = [n for n in model if n not in values]
    unexpected = [n for n in values if n not in model]
    counts = (f"{len(mismatch)} shape/dtype mismatch, {len(missing)} missing, {len(unexpected)} unexpected "
              f"of {len(model)} model tensors")
    if strict and (mismatch or missing or unexpected):
        first = (f"{mismatch[0]}: {details[mismatch[0]]}" if mismatch else
                 f"{missing[0]}: not in the file" if missing else f"{unexpected[0]}: not in the model")
        raise InputError(f"{where}: model.init_strict: {first} ({counts})")
    if not loaded:
        raise InputError(f"{where}: no tensor matches the model ({counts}); is it a state dict of "
                         "this model.name?")
    tensors = {}
    for name in loaded:
        v = values[name]
        t = v if isinstance(v, paddle.Tensor) else paddle.to_tensor(v)
        if t.is_floating_point() and not bool(paddle.isfinite(t).all()):
            raise InputError(f"{where}: tensor {name} holds NaN/Inf")
        tensors[name] = t.astype(model[name].dtype)  # floating point: cast to the parameter's dtype
    for name, t in tensors.items():
        model[name].set_value(t)
    rest = [_listing(kind, names, details) for kind, names in (("shape/dtype mismatch, fresh init kept", mismatch),
                                                               ("missing, fresh init", missing),
                                                               ("unexpected, ignored", unexpected)) if names]
    emit({"event": "notice", "text": f"{where}: loaded {len(loaded)} of {len(model)} tensors; "
                                     + ("; ".join(rest) or "every tensor matched")})
    record = {"path": str(src.path.resolve()), "kind": src.kind, "sha256": sha, "loaded": len(loaded),
              "shape_mismatch": mismatch, "missing": missing, "unexpected": unexpected}
    if src.manifest_sha256:
        record["manifest_sha256"] = src.manifest_sha256
    return record


def describe(record: dict[str, Any], check: bool = False) -> str:
    """One line on a train manifest's `init` record for `pipe inspect`; with `check`, whether the
    source still verifies and is the one used."""
    text = (f"init   {record['path']} ({record['kind']}, sha256 {record['sha256'][:12]}): loaded {record['loaded']}, "
            f"{len(record['shape_mismatch'])} shape/dtype mismatch, {len(record['missing'])} missing, "
            f"{len(record['unexpected'])} unexpected")
    if not check:
        return text
    path = Path(record["path"])
    try:
        if record["kind"] in ("train", "program"):
            now = artifacts.verify(path, (record["kind"].replace("program", "export"),)).manifest_sha256 == \
                record.get("manifest_sha256")
        else:
            now = path.is_file() and artifacts.sha256_file(path) == record["sha256"]
    except InputError as e:
        return f"{text}  [{e}]"
    return f"{text}  [{'verified' if now else 'changed since it was used'}]"


def _read(paddle: Any, src: Source) -> tuple[dict[str, Any], str]:
    """The source's tensors (numpy arrays or paddle tensors) and the sha256 of the file they came from."""
    if src.kind == "pdparams":
        data = src.file.read_bytes()  # hashed and unpickled from the same bytes
        return _unpickle_state_dict(data, src.file), hashlib.sha256(data).hexdigest()
    sha = artifacts.sha256_file(src.file)
    return runtime.load_safetensors(paddle, src.file), sha


# What paddle.save(state_dict) pickles, and nothing else (see the module docstring); numpy 2 writes the
# first one as numpy._core.multiarray.
_ALLOWED_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                    ("numpy", "ndarray"), ("numpy", "dtype")}


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    """`_codecs.encode` as protocol 2 uses it for bytes, limited to that one encoding."""
    if encoding != "latin1" or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}")
    return text.encode("latin1")


class _Restricted(pickle.Unpickler):
    """The one unpickler pipe uses: a global outside `_ALLOWED_GLOBALS` is refused, naming the file."""

    def __init__(self, f: Any, where: Path):
        super().__init__(f)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("_codecs", "encode"):
            return _latin1
        if (module, name) not in _ALLOWED_GLOBALS:
            raise InputError(f"model.init {self.where}: refused to unpickle global {module}.{name} "
                             "(a .pdparams may only hold numpy arrays)")
        return super().find_class(module, name)


def _unpickle_state_dict(data: bytes, where: Path) -> dict[str, np.ndarray]:
    try:
        state = _Restricted(io.BytesIO(data), where).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OverflowError, RecursionError, UnicodeError) as e:
        raise InputError(f"model.init {where}: not a readable .pdparams state dict ({e.__class__.__name__})") from None
    if not isinstance(state, dict):
        raise InputError(f"model.init {where}: holds a {type(state).__name__}, not a state dict")
    state.pop(_PADDLE_META, None)
    for name, v in state.items():
        if not isinstance(name, str) or not isinstance(v, np.ndarray) or v.dtype.kind not in "biufc":
            what = f"{v.dtype} array" if isinstance(v, np.ndarray) else type(v).__name__
            raise InputError(f"model.init {where}: entry {name!r} is a {what}, not a numeric tensor "
                             "(expected a model's state dict)")
    return state


def _difference(v: Any, param: Any) -> str:
    """Why `v` cannot go into `param` ('' if it can): another shape, or another dtype where either is
    not floating point."""
    shape, want = list(v.shape), list(param.shape)
    if shape != want:
        return f"shape {shape} in the file, {want} in the model"
    have, dtype = _dtype(v), _dtype(param)
    floating = (v.dtype.kind == "f") if isinstance(v, np.ndarray) else v.is_floating_point()
    if have != dtype and not (floating and param.is_floating_point()):
        return f"dtype {have} in the file, {dtype} in the model"
    return ""


def _dtype(v: Any) -> str:
    if isinstance(v, np.ndarray):
        return str(v.dtype)
    return str(v.dtype).replace("paddle.", "").replace("DataType.", "").lower()


def _listing(kind: str, names: list[str], details: dict[str, str]) -> str:
    shown = [f"{n} ({details[n]})" if n in details else n for n in names[:_SHOWN]]
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return f"{len(names)} {kind}: {', '.join(shown)}{more}"
