"""Someone else's exported Paddle model, read as data before any engine loads it (RELIABILITY.md §7).

    prog = paddle_program.find(Path("ch_PP-OCRv4_rec_infer"))      # the one program and its params
    io_ = paddle_program.read(prog)                                  # inputs, outputs, parameters
    paddle_program.check_params(prog, io_)                           # the params file holds exactly those
    paddle_program.translate_to_pir(paddle, legacy_prefix, prefix)   # a legacy program as Paddle 3's PIR

A program is `<prefix>.pdmodel` (the legacy ProgramDesc, a protobuf) or `<prefix>.json` (Paddle 3's PIR),
beside `<prefix>.pdiparams`, any prefix (`inference.*`, `model.*`). The params file is a sequence of
dense tensors in the order of the persistable variables' sorted names, each a small header (versions, LoD,
a TensorDesc protobuf with dtype and dims) and its raw bytes (Paddle's `save_combine`); walking it checks
every tensor's dtype and shape against the program and that nothing is missing, left over or cut short,
without running Paddle on it. The `.pdiparams.info` beside PaddleOCR's params is a pickle: never opened.
The legacy protobuf is parsed with Paddle's own generated module (importing paddle); the PIR JSON with json.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline import iospec
from pipeline.errors import InputError

PROGRAM_SUFFIXES = (".pdmodel", ".json")
# TensorDesc data_type -> (numpy dtype name, bytes per element); the ids of Paddle's framework.proto VarType.
_PROTO_DTYPES = {0: ("bool", 1), 1: ("int16", 2), 2: ("int32", 4), 3: ("int64", 8), 4: ("float16", 2),
                 5: ("float32", 4), 6: ("float64", 8), 20: ("uint8", 1), 21: ("int8", 1), 22: ("bfloat16", 2)}
# PIR's JSON type tags -> numpy dtype names.
_PIR_DTYPES = {"0.t_f32": "float32", "0.t_f16": "float16", "0.t_bf16": "bfloat16", "0.t_f64": "float64",
               "0.t_i64": "int64", "0.t_i32": "int32", "0.t_i16": "int16", "0.t_i8": "int8", "0.t_ui8": "uint8",
               "0.t_bool": "bool"}


@dataclass(frozen=True)
class Program:
    program: Path  # <prefix>.pdmodel or <prefix>.json
    params: Path  # <prefix>.pdiparams

    @property
    def format(self) -> str:
        return "legacy" if self.program.suffix == ".pdmodel" else "pir"


@dataclass(frozen=True)
class Param:
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ProgramIO:
    inputs: tuple[iospec.Tensor, ...]  # program names, -1 for dynamic axes
    outputs: tuple[iospec.Tensor, ...]  # the fetched variables, by the program's names, in fetch order
    params: tuple[Param, ...]  # persistable variables, sorted by name (the params file's order)
    op_types: frozenset[str]


def find(src: Path) -> Program:
    """The one program in `src` (a directory, or the program file itself) with its params beside it."""
    src = Path(src)
    if src.is_file():
        if src.suffix not in PROGRAM_SUFFIXES:
            raise InputError(f"{src}: not a Paddle program (a .pdmodel or a PIR .json)")
        params = src.with_suffix(".pdiparams")
        if not params.is_file():
            raise InputError(f"{src}: no {params.name} beside it")
        return Program(src, params)
    if not src.is_dir():
        raise InputError(f"{src}: no such directory")
    found = sorted(p for p in src.iterdir() if p.suffix in PROGRAM_SUFFIXES and p.is_file()
                   and p.with_suffix(".pdiparams").is_file())
    if not found:
        raise InputError(f"{src}: no Paddle program (a <prefix>.pdmodel or <prefix>.json with its <prefix>.pdiparams)")
    if len(found) > 1:
        raise InputError(f"{src}: {len(found)} programs ({', '.join(p.name for p in found)}); pass the one to "
                         f"import as SRC")
    return Program(found[0], found[0].with_suffix(".pdiparams"))


def read(prog: Program) -> ProgramIO:
    """Inputs, outputs and parameters as the program declares them (no parameter is read)."""
    try:
        raw = prog.program.read_bytes()
    except OSError as e:
        raise InputError(f"{prog.program}: cannot read ({e.strerror})") from None
    return _read_legacy(prog.program, raw) if prog.format == "legacy" else _read_pir(prog.program, raw)


def check_params(prog: Program, io_: ProgramIO) -> None:
    """The params file holds exactly the program's persistable variables, in order, of their dtypes and
    shapes, and nothing after them; one line naming the file otherwise."""
    where = prog.params
    try:
        data = prog.params.read_bytes()
    except OSError as e:
        raise InputError(f"{where}: cannot read ({e.strerror})") from None
    at, want = 0, io_.params
    for i, p in enumerate(want):
        try:
            dtype, dims, at = _tensor_header(data, at)
        except (struct.error, IndexError, ValueError):
            raise InputError(f"{where}: ends or breaks inside tensor {i + 1} of {len(want)} ({p.name}); truncated "
                             f"or not this program's params") from None
        if dtype is None or (dtype[0], dims) != (p.dtype, p.shape):
            got = f"{dtype[0] if dtype else 'an unknown dtype'} {list(dims)}"
            raise InputError(f"{where}: tensor {i + 1} of {len(want)} is {got}, the program declares {p.name} "
                             f"{p.dtype} {list(p.shape)}; not this program's params")
        size = dtype[1]
        for d in dims:
            size *= d
        at += size
        if at > len(data):
            raise InputError(f"{where}: ends inside tensor {i + 1} of {len(want)} ({p.name}): truncated")
    if at != len(data):
        raise InputError(f"{where}: {len(data) - at} bytes after the program's {len(want)} tensors; not this "
                         f"program's params")


def _tensor_header(data: bytes, at: int) -> tuple[tuple[str, int] | None, tuple[int, ...], int]:
    """One serialized dense tensor's header at `at`: (dtype, dims, offset of its raw bytes)."""
    (version,) = struct.unpack_from("<I", data, at)
    if version != 0:
        raise ValueError("version")
    (lod_levels,) = struct.unpack_from("<Q", data, at + 4)
    at += 12
    for _ in range(lod_levels):
        (n,) = struct.unpack_from("<Q", data, at)
        at += 8 + n
    (tensor_version,) = struct.unpack_from("<I", data, at)
    (desc_size,) = struct.unpack_from("<i", data, at + 4)
    if tensor_version != 0 or not 0 <= desc_size <= 4096:
        raise ValueError("desc")
    desc, at = data[at + 8: at + 8 + desc_size], at + 8 + desc_size
    if len(desc) != desc_size:
        raise ValueError("short")
    dtype_id, dims = _tensor_desc(desc)
    return _PROTO_DTYPES.get(dtype_id), tuple(dims), at


def _tensor_desc(b: bytes) -> tuple[int, list[int]]:
    """TensorDesc {data_type = 1 (varint), dims = 2 (int64, packed or not)}, parsed by hand: two fields."""
    i, dtype, dims = 0, -1, []

    def varint(i: int) -> tuple[int, int]:
        out = shift = 0
        while True:
            c = b[i]
            i += 1
            out |= (c & 0x7F) << shift
            shift += 7
            if c < 0x80:
                return out, i

    while i < len(b):
        key, i = varint(i)
        field, wire = key >> 3, key & 7
        if field == 1 and wire == 0:
            dtype, i = varint(i)
        elif field == 2 and wire == 0:
            d, i = varint(i)
            dims.append(d)
        elif field == 2 and wire == 2:
            n, i = varint(i)
            end = i + n
            while i < end:
                d, i = varint(i)
                dims.append(d)
        else:
            raise ValueError("field")
    return dtype, dims


def _read_legacy(path: Path, raw: bytes) -> ProgramIO:
    from pipeline import runtime

    runtime.import_paddle()
    from google.protobuf.message import DecodeError
    from paddle.base.proto import framework_pb2 as pb

    try:
        desc = pb.ProgramDesc.FromString(raw)
        block = desc.blocks[0]
    except (DecodeError, IndexError, RuntimeWarning):
        raise InputError(f"{path}: not a Paddle program (the ProgramDesc does not parse)") from None
    vars_ = {v.name: v for v in block.vars}

    def tensor(name: str) -> iospec.Tensor:
        t = vars_[name].type.dense_tensor.tensor
        dtype = _PROTO_DTYPES.get(t.data_type, ("?", 0))[0]
        shape = tuple(int(d) for d in t.dims)
        return iospec.Tensor(name, dtype, shape)

    feeds = sorted(((op.attrs[0].i if op.attrs else 0, op.outputs[0].arguments[0]) for op in block.ops
                    if op.type == "feed"), key=lambda c: c[0])
    fetches = sorted((((next((a.i for a in op.attrs if a.name == "col"), 0)), op.inputs[0].arguments[0])
                      for op in block.ops if op.type == "fetch"), key=lambda c: c[0])
    if not feeds or not fetches:
        raise InputError(f"{path}: an inference program needs feed and fetch ops (this one has "
                         f"{len(feeds)} and {len(fetches)}); was it saved with save_inference_model/jit.save?")
    params = []
    for name in sorted(n for n, v in vars_.items() if v.persistable and n not in ("feed", "fetch")):
        t = tensor(name)
        params.append(Param(name, t.dtype, t.shape))
    return ProgramIO(tuple(tensor(n) for _, n in feeds), tuple(tensor(n) for _, n in fetches), tuple(params),
                     frozenset(op.type for op in block.ops))


def _read_pir(path: Path, raw: bytes) -> ProgramIO:
    try:
        doc = json.loads(raw)
        if doc["base_code"]["magic"] != "pir":
            raise ValueError
        ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    except (ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        raise InputError(f"{path}: not a Paddle PIR program (JSON with base_code.magic 'pir')") from None
    def tensor(op: dict[str, Any]) -> iospec.Tensor:
        d = op["O"][0]["TT"]["D"]
        name = next(a for a in op["A"] if a.get("N") == "name")["AT"]["D"]
        return iospec.Tensor(str(name), _PIR_DTYPES.get(d[0]["#"], "?"), tuple(int(s) for s in d[1]))

    try:
        params, inputs, outputs = [], [], []
        for op in ops:
            if op["#"] == "p":  # a parameter: A = [.., .., .., name], O.TT.D = [dtype, dims, layout, ...]
                d = op["O"]["TT"]["D"]
                params.append(Param(str(op["A"][3]), _PIR_DTYPES.get(d[0]["#"], "?"), tuple(int(s) for s in d[1])))
            elif op["#"].endswith((".feed", ".data")):
                inputs.append(tensor(op))
            elif op["#"].endswith(".fetch"):
                outputs.append(tensor(op))
    except (KeyError, IndexError, TypeError, StopIteration, ValueError):
        raise InputError(f"{path}: a PIR program pipe cannot read (an op it does not recognise)") from None
    if not inputs or not outputs:
        raise InputError(f"{path}: an inference program needs feeds and fetches (this one has {len(inputs)} and "
                         f"{len(outputs)})")
    return ProgramIO(tuple(inputs), tuple(outputs), tuple(sorted(params, key=lambda p: p.name)),
                     frozenset(str(op["#"]) for op in ops))


def translate_to_pir(paddle: Any, legacy: Path, prefix: Path, upsample_as_tile: bool = True) -> int:
    """Legacy program -> PIR (facts §17: load under OldIrGuard, translate the ProgramDesc, save under IrGuard
    with the data ops' results as feeds and the fetch ops' operands as fetches; jit.load + jit.save and plain
    PIR-mode loading fail on PP-OCR programs). Returns how many upsamplings `_upsample_as_tile` rewrote."""
    paddle.enable_static()
    try:
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            with paddle.pir_utils.OldIrGuard():
                program, _, _ = paddle.static.load_inference_model(str(legacy), exe)
            translated = paddle.pir.translate_to_pir(program.desc)
            with paddle.pir_utils.IrGuard():
                rewritten = _upsample_as_tile(paddle, translated) if upsample_as_tile else 0
                ops = translated.global_block().ops
                feeds = [op.result(0) for op in ops if op.name() == "pd_op.data"]
                fetches = [op.operand_source(0) for op in ops if op.name() == "pd_op.fetch"]
                paddle.static.save_inference_model(str(prefix), feeds, fetches, exe, program=translated)
    finally:
        paddle.disable_static()
    return rewritten


def _upsample_as_tile(paddle: Any, program: Any) -> int:
    """Each nearest upsampling by whole factors (NCHW, no size inputs: PP-OCRv4 det's FPN, x2/x4/x8) as
    unsqueeze + tile + flatten, the same values (nearest with integer scales repeats each pixel), as pipe's
    own detector upsamples (pipeline/tasks/detection/detector.py, facts §16). Why: the translation stores the op's
    `scale` as float64, which Paddle Inference 3.3.1 cannot run with oneDNN ("ConvertPirAttribute2RuntimeAttribute not
    support [pir::ArrayAttribute<pir::DoubleAttribute>]", open PaddlePaddle/Paddle#79749; float32 fails PIR's
    verifier); rewritten, the program runs with oneDNN as fast as the legacy one (PP-OCRv4 det: 214 vs 241
    ms/page, outputs within 2e-10) instead of without its op placement (pipeline/engines/paddle.py: 2.4x slower)."""
    block, n = program.global_block(), 0
    with paddle.static.program_guard(program):
        for op in list(block.ops):
            if op.name() != "pd_op.nearest_interp":
                continue
            a = op.attrs()
            scale = [float(v) for v in a.get("scale") or []]
            if (len(scale) != 2 or any(v < 1 or v != int(v) for v in scale) or a.get("data_format") != "NCHW"
                    or a.get("align_corners") or a.get("out_h") != -1 or a.get("out_w") != -1
                    or any(op.operand_source(i).initialized() for i in range(1, op.num_operands()))):
                continue  # sizes given, corners aligned or fractional factors: left as translated
            paddle.pir.set_insertion_point(op)
            sh, sw = (int(v) for v in scale)
            y = paddle.tile(paddle.unsqueeze(op.operand_source(0), [3, 5]), [1, 1, 1, sh, 1, sw])  # [N,C,H,sh,W,sw]
            op.result(0).replace_all_uses_with(paddle.flatten(paddle.flatten(y, 4, 5), 2, 3))
            block.remove_op(op)
            n += 1
    return n


def f64_interp_scales(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A PIR program's (its JSON document's) float64 `scale` entries of interpolation ops (nearest_interp,
    bilinear_interp, ...), as the document's own dicts: what Paddle's translation of a legacy program with an
    upsampling writes (PP-OCRv4 det's FPN), which oneDNN cannot run and paddle2onnx cannot read."""
    ops = doc["program"]["regions"][0]["blocks"][0]["ops"]
    return [v for op in ops if str(op.get("#", "")).endswith("_interp") for a in op.get("A", [])
            if a.get("N") == "scale" for v in a["AT"].get("D", []) if v.get("#") == "0.a_f64"]


def describe(io_: ProgramIO) -> dict[str, Any]:
    return {"inputs": [t.to_dict() for t in io_.inputs], "outputs": [t.to_dict() for t in io_.outputs],
            "params": len(io_.params)}
