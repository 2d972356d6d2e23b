"""An exported Paddle program (legacy or PIR) as a trainable dygraph layer: how `pipe train --init` fine-tunes an
import.

    layer = program_layer.build(paddle, Path("RUN/export/legacy/model"))   # .pdmodel + .pdiparams
    layer = program_layer.build(paddle, Path("RUN/export/model"))          # a PIR import: .json + .pdiparams
    probs = layer(x)                                                        # the program's one output
    program_layer.write_params(src_params, dest_params, layer.values())     # the fine-tuned weights, in place

Why not the other routes (facts §17): `paddle.jit.load` of the program gives a layer whose parameters get no
gradient (234 of 234 None); training the loaded program in static graph works but is a second trainer, with
its own optimizer, data parallelism, AMP, checkpoints and resume. This layer runs the program's ops one by one
as dygraph calls (`paddle.nn.functional`), with every persistable variable a parameter (a buffer for
batch-norm statistics, which stay frozen: the program was saved with is_test, and its batches of a few lines
would make poor statistics). So the one trainer (pipeline/trainer.py) trains it as any other `nn.Layer`:
DataParallel, auto_cast, the optimizer's state, state_dict checkpoints.

The ops are the program's, read from its ProgramDesc with Paddle's generated protobuf module (as
paddle_program reads it): the op types PaddleOCR's exported recognizers use (PP-OCRv4 rec: 25 types, 323
ops). An op type this does not know is refused in one line before anything is built. Dropout runs as
the program declares it when training and is the identity in eval (`upscale_in_train`).

A PIR program (Paddle 3's `inference.json`: PaddleOCR 3.x and PaddleX 3 export only that) is read as data,
`json.loads` and nothing else (`read_pir_ops`): each `pd_op.*` op becomes the legacy op above that computes the
same (`pd_op.add` -> `elementwise_add`, `pd_op.hardswish` -> `hard_swish`, ...), and the operands PIR makes
separate constant ops of (`full`, `full_int_array`, a `combine` of them: a slice's starts, a pool's kernel, a
dropout's p) are folded back into that op's attributes. So one set of op functions runs both forms: PP-OCRv4 rec
translated to PIR gives the legacy layer's output and gradients to the bit. Its `.pdiparams` is the same
format, in the same order (sorted names), as a legacy one, and `write_params` writes it the same way.

Going back: `write_params` writes a `.pdiparams` beside the untouched `.pdmodel` with every tensor's header
as it was and its bytes the layer's, so what comes out of training is the same kind of program as what
went in, and `pipe import`'s path (PIR translation, ONNX, parity, scoring) takes it unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline.errors import InputError
from pipeline.nets import paddle_program

_ATTR_FIELDS = {0: "i", 1: "f", 2: "s", 3: "ints", 4: "floats", 5: "strings", 6: "b", 7: "bools", 9: "l",
                11: "longs", 12: "float64s", 15: "float64"}
_STATS = ("Mean", "Variance")  # batch_norm's inputs that are statistics, not weights


class Op:
    __slots__ = ("type", "ins", "outs", "attrs")

    def __init__(self, type_: str, ins: dict[str, list[str]], outs: dict[str, list[str]], attrs: dict[str, Any]):
        self.type, self.ins, self.outs, self.attrs = type_, ins, outs, attrs

    def x(self, slot: str = "X") -> str:
        return self.ins[slot][0]

    def out(self, slot: str = "Out") -> str:
        return self.outs[slot][0]


def read_ops(path: Path) -> tuple[list[Op], list[str], list[str]]:
    """(ops, feed names, fetch names) of a legacy program's main block, attributes as Python values."""
    from pipeline import runtime

    runtime.import_paddle()
    from paddle.base.proto import framework_pb2 as pb

    desc = pb.ProgramDesc.FromString(path.read_bytes())
    ops, feeds, fetches = [], [], []
    for o in desc.blocks[0].ops:
        attrs = {}
        for a in o.attrs:
            f = _ATTR_FIELDS.get(a.type)
            if f is not None:
                v = getattr(a, f)
                attrs[a.name] = list(v) if f in ("ints", "floats", "strings", "bools", "longs", "float64s") else v
        ins = {v.parameter: list(v.arguments) for v in o.inputs}
        outs = {v.parameter: list(v.arguments) for v in o.outputs}
        if o.type == "feed":
            feeds.append((attrs.get("col", 0), outs["Out"][0]))
        elif o.type == "fetch":
            fetches.append((attrs.get("col", 0), ins["X"][0]))
        else:
            ops.append(Op(o.type, ins, outs, attrs))
    return ops, [n for _, n in sorted(feeds)], [n for _, n in sorted(fetches)]


# ------------------------------------------------------------------ Paddle 3's PIR program (inference.json)

_PIR_NAMES = {"add": "elementwise_add", "multiply": "elementwise_mul", "subtract": "elementwise_sub",
              "divide": "elementwise_div", "conv2d": "conv2d", "depthwise_conv2d": "depthwise_conv2d",
              "batch_norm": "batch_norm", "batch_norm_": "batch_norm", "layer_norm": "layer_norm",
              "matmul": "matmul_v2", "dropout": "dropout", "shape": "shape", "shape64": "shape", "slice": "slice",
              "reshape": "reshape2", "pool2d": "pool2d", "concat": "concat", "relu": "relu", "sigmoid": "sigmoid",
              "hardswish": "hard_swish", "hardsigmoid": "hard_sigmoid", "swish": "swish", "softmax": "softmax",
              "scale": "scale", "assign": "assign", "transpose": "transpose2", "flatten": "flatten_contiguous_range",
              "squeeze": "squeeze2", "unsqueeze": "unsqueeze2"}
_PIR_DIALECTS = {"0": "builtin", "1": "pd_op"}
# each PIR op's operands in order, as the legacy op's input slots (None: an operand folded into an attribute)
_PIR_INPUTS = {"conv2d": ("Input", "Filter"), "depthwise_conv2d": ("Input", "Filter"),
               "batch_norm": ("X", "Mean", "Variance", "Scale", "Bias"), "layer_norm": ("X", "Scale", "Bias"),
               "elementwise_add": ("X", "Y"), "elementwise_mul": ("X", "Y"), "elementwise_sub": ("X", "Y"),
               "elementwise_div": ("X", "Y"), "matmul_v2": ("X", "Y"), "shape": ("Input",),
               "slice": ("Input", "starts", "ends"), "reshape2": ("X", "shape"), "pool2d": ("X", "ksize"),
               "concat": ("X", "axis"), "scale": ("X", "scale"), "squeeze2": ("X", "axes"),
               "unsqueeze2": ("X", "axes"), "dropout": ("X", None, "dropout_prob")}
_PIR_OUTPUT = {"conv2d": "Output", "depthwise_conv2d": "Output", "batch_norm": "Y", "layer_norm": "Y"}
# PIR attribute names that differ from the legacy op's
_PIR_ATTRS = {"transpose_x": "trans_x", "transpose_y": "trans_y", "perm": "axis", "mode": "dropout_implementation"}


def _pir_attr(a: dict[str, Any]) -> Any:
    """One PIR attribute value ({"#": "0.a_i32", "D": 2}, arrays of them, 1.a_intarray's list) as Python."""
    tag, d = a.get("#"), a.get("D")
    if tag == "0.a_array":
        return [_pir_attr(v) for v in d]
    return d


def read_pir_ops(path: Path) -> tuple[list[Op], list[str], list[str], dict[str, str]]:
    """(ops, feed names, fetch names, {value: parameter name}) of a PIR program, read with json.loads only: each
    `pd_op.*` op as the legacy op program_layer runs (`_PIR_NAMES`), its operands in that op's input slots,
    constant operands (`full`, `full_int_array`, `combine` of constants) folded into the attributes the legacy
    op has for them, values named `%<id>`, parameters by their own names (as in the params file). An op this
    does not know is refused in one line naming it."""
    import json

    try:
        doc = json.loads(path.read_bytes())
        if doc["base_code"]["magic"] != "pir":
            raise ValueError
        raw = doc["program"]["regions"][0]["blocks"][0]["ops"]
    except (OSError, ValueError, KeyError, IndexError, TypeError, UnicodeDecodeError):
        raise InputError(f"{path}: not a Paddle PIR program (JSON with base_code.magic 'pir')") from None
    names: dict[int, str] = {}  # value id -> the name it goes by in the layer's variables
    consts: dict[str, np.ndarray] = {}  # constants known when reading (full, full_int_array)
    combined: dict[str, list[str]] = {}  # builtin.combine's result -> its operands
    params: dict[str, str] = {}
    ops, feeds, fetches = [], [], []
    unknown: set[str] = set()

    def value(v: dict[str, Any]) -> str | None:
        i = int(v["%"])
        return None if i == 0 else names.setdefault(i, f"%{i}")  # %0: a null operand (an absent optional input)

    try:
        for o in raw:
            tag = str(o["#"])
            if tag == "p":  # a parameter: A = [.., .., .., name]
                names[int(o["O"]["%"])] = params[str(o["A"][3])] = str(o["A"][3])
                continue
            dialect, _, kind = tag.partition(".")
            full = f"{_PIR_DIALECTS.get(dialect, dialect)}.{kind}"
            attrs = {a["N"]: _pir_attr(a["AT"]) for a in o.get("A", [])}
            if kind in ("feed", "data"):  # the input goes by its own name (x), as in a legacy program
                names[int(o["O"][0]["%"])] = str(attrs["name"])
            ins = [value(v) for v in o.get("I", [])]
            outs = [value(v) for v in o.get("O", [])]
            if kind in ("feed", "data"):
                feeds.append((int(attrs.get("col", len(feeds))), outs[0]))
            elif kind == "fetch":
                fetches.append((int(attrs.get("col", len(fetches))), ins[0]))
            elif tag == "0.combine":
                combined[outs[0]] = ins
            elif kind == "full_int_array":
                consts[outs[0]] = np.asarray(attrs["value"], dtype=attrs.get("dtype", "int64"))
                ops.append(Op("constant", {}, {"Out": [outs[0]]}, {"value": consts[outs[0]]}))
            elif kind == "full":
                consts[outs[0]] = np.full(list(attrs["shape"]), attrs["value"], dtype=attrs.get("dtype", "float32"))
                ops.append(Op("constant", {}, {"Out": [outs[0]]}, {"value": consts[outs[0]]}))
            elif dialect == "1" and kind in _PIR_NAMES:
                ops.append(_pir_op(_PIR_NAMES[kind], ins, outs, attrs, consts, combined, f"{path}: {full}"))
            else:
                unknown.add(full)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise InputError(f"{path}: a PIR program pipe cannot read ({e.__class__.__name__} at op "
                         f"{len(ops) + len(feeds) + len(fetches) + len(params) + len(unknown) + 1})") from None
    if unknown:
        raise InputError(f"{path}: pipe train cannot run op(s) {', '.join(sorted(unknown))} of this program "
                         f"(it runs {len(_PIR_NAMES)} pd_op types: pipeline/nets/program_layer.py)")
    return ops, [n for _, n in sorted(feeds)], [n for _, n in sorted(fetches)], params


def _pir_op(type_: str, ins: list[str | None], outs: list[str | None], attrs: dict[str, Any],
            consts: dict[str, np.ndarray], combined: dict[str, list[str]], where: str) -> Op:
    """One PIR op as the legacy op `type_`: operands into slots, constant operands into attributes."""
    slots = _PIR_INPUTS.get(type_, ("X",))
    legacy = {_PIR_ATTRS.get(k, k): v for k, v in attrs.items()}
    if type_ == "batch_norm":
        legacy["data_layout"] = attrs.get("data_format", "NCHW")
    slot_ins: dict[str, list[str]] = {}
    for slot, name in zip(slots, ins):
        if slot is None or name is None:
            continue
        if slot in ("X", "Input", "Filter", "Y", "Mean", "Variance", "Scale", "Bias") and type_ != "concat":
            slot_ins[slot] = [name]
            continue
        if name in combined:  # a list of values: concat's inputs, reshape's shape from shape/slice results
            parts = combined[name]
            if type_ == "concat":
                slot_ins["X"] = parts
            elif type_ == "reshape2":
                slot_ins["ShapeTensor"] = parts
            elif all(p in consts for p in parts):
                legacy[slot] = [c.item() for p in parts for c in consts[p].reshape(-1)]
            else:
                raise InputError(f"{where} {outs[0]}: a tensor-valued {slot} is not supported")
            continue
        if type_ == "reshape2" and name not in consts:
            slot_ins["Shape"] = [name]
            continue
        if name not in consts:
            raise InputError(f"{where} {outs[0]}: a tensor-valued {slot} is not supported")
        c = consts[name].reshape(-1)
        legacy[slot] = c.item() if slot in ("axis", "scale", "dropout_prob") else c.tolist()
    return Op(type_, slot_ins, {_PIR_OUTPUT.get(type_, "Out"): [outs[0]]}, legacy)


def read_params(prog: paddle_program.Program, io_: paddle_program.ProgramIO) -> dict[str, np.ndarray]:
    """Every persistable variable's value, by name, from the params file (checked first: check_params)."""
    paddle_program.check_params(prog, io_)
    data = prog.params.read_bytes()
    out, at = {}, 0
    for p in io_.params:
        (dtype, _), dims, at = paddle_program._tensor_header(data, at)
        n = int(np.prod(dims, dtype=np.int64))
        a = np.frombuffer(data, np.dtype(dtype), n, at).reshape(dims)
        at += a.nbytes
        out[p.name] = a.copy()
    return out


def write_params(src: Path, dest: Path, values: dict[str, np.ndarray], io_: paddle_program.ProgramIO) -> None:
    """`src`'s params file with each tensor's bytes replaced by `values[name]` (same dtype and shape; a name
    not in `values` keeps its bytes), every header byte for byte: the same file format Paddle wrote."""
    data = src.read_bytes()
    parts, at = [], 0
    for p in io_.params:
        start = at
        (dtype, _), dims, at = paddle_program._tensor_header(data, at)
        size = int(np.prod(dims, dtype=np.int64)) * np.dtype(dtype).itemsize
        parts.append(data[start:at])
        if p.name in values:
            v = np.ascontiguousarray(values[p.name], dtype=np.dtype(dtype))
            if tuple(v.shape) != tuple(dims):
                raise ValueError(f"{p.name}: shape {list(v.shape)}, the program's {list(dims)}")
            parts.append(v.tobytes())
        else:
            parts.append(data[at:at + size])
        at += size
    dest.write_bytes(b"".join(parts))


def key(name: str) -> str:
    """A program variable's name as a layer attribute (a state_dict key): dots are not allowed there."""
    return name.replace(".", "__")


def build(paddle: Any, prefix: Path) -> Any:
    """The layer over `<prefix>.pdmodel` + `<prefix>.pdiparams` (a legacy program, e.g. an import's legacy/), or
    over `<prefix>.json` + `<prefix>.pdiparams` when there is no .pdmodel (a PIR program, e.g. a PaddleOCR 3.x
    export's inference.json, or an import's model.json)."""
    legacy = Path(f"{prefix}.pdmodel")
    program = legacy if legacy.is_file() else Path(f"{prefix}.json")
    prog = paddle_program.Program(program, Path(f"{prefix}.pdiparams"))
    io_ = paddle_program.read(prog)
    if prog.format == "legacy":
        ops, feeds, fetches = read_ops(prog.program)
    else:
        ops, feeds, fetches, params = read_pir_ops(prog.program)
        if set(params) != {p.name for p in io_.params}:
            raise InputError(f"{prog.program}: its parameter ops and its declared parameters differ")
    unknown = sorted({o.type for o in ops} - set(_OPS))
    if unknown:
        raise InputError(f"{prog.program}: pipe train cannot run op(s) {', '.join(unknown)} of this program "
                         f"(it runs {len(_OPS)} op types: pipeline/nets/program_layer.py)")
    values = read_params(prog, io_)
    stats = {a for o in ops if o.type == "batch_norm" for s in _STATS for a in o.ins.get(s, [])}
    return _layer_class(paddle)(ops, feeds, fetches, values, stats)


def _layer_class(paddle: Any) -> type:
    class ProgramLayer(paddle.nn.Layer):
        """The program's ops as dygraph calls; parameters named by `key(program name)`."""

        def __init__(self, ops: list[Op], feeds: list[str], fetches: list[str], values: dict[str, np.ndarray],
                     stats: set[str]):
            super().__init__()
            self.ops, self.feeds, self.fetches = ops, feeds, fetches
            self.names = sorted(values)  # program names, the params file's order
            # what each op is the last reader of: dropped from the run's variables after it, so evaluation holds
            # one op's inputs at a time, not every activation of the program (3.5x the memory on 32 lines)
            last: dict[str, int] = {}
            for i, op in enumerate(ops):
                for args in op.ins.values():
                    for a in args:
                        last[a] = i
            keep = set(values) | set(fetches)
            self.frees = [[] for _ in ops]
            for a, i in last.items():
                if a not in keep:
                    self.frees[i].append(a)
            for name in self.names:
                v = values[name]
                if name in stats:
                    self.register_buffer(key(name), paddle.to_tensor(v), persistable=True)
                else:
                    p = self.create_parameter(list(v.shape), dtype=str(v.dtype),
                                              default_initializer=paddle.nn.initializer.Assign(v))
                    p.stop_gradient = np.dtype(v.dtype).kind != "f"
                    self.add_parameter(key(name), p)

        def forward(self, *inputs: Any) -> Any:
            env: dict[str, Any] = dict(zip(self.feeds, inputs))
            for name in self.names:
                env[name] = getattr(self, key(name))
            for op, frees in zip(self.ops, self.frees):
                _OPS[op.type](paddle, op, env, self.training)
                for a in frees:
                    env.pop(a, None)
            out = [env[n] for n in self.fetches]
            return out[0] if len(out) == 1 else tuple(out)

        def trainable_in_order(self) -> list[Any]:
            """The trainable parameters in the order the program first reads them: the backbone's early blocks
            first, the head's last (what finetune.freeze_early counts from)."""
            first: dict[str, int] = {}
            for i, op in enumerate(self.ops):
                for args in op.ins.values():
                    for a in args:
                        first.setdefault(a, i)
            params = [(first.get(n, len(self.ops)), n, getattr(self, key(n))) for n in self.names]
            return [p for _, _, p in sorted(params, key=lambda t: t[:2])
                    if isinstance(p, paddle.base.framework.EagerParamBase) and not p.stop_gradient]

        def values(self) -> dict[str, np.ndarray]:
            """Every persistable variable's value by its program name (what write_params writes)."""
            return {n: getattr(self, key(n)).numpy() for n in self.names}

    return ProgramLayer


# ------------------------------------------------------------------ the ops


def _tensor(paddle: Any, v: Any) -> Any:
    return paddle.to_tensor(v) if isinstance(v, np.ndarray) else v


def _broadcast(paddle: Any, x: Any, y: Any, axis: int) -> Any:
    """Legacy elementwise broadcasting: `y` of lower rank lines up with `x`'s dims from `axis` (-1: the end)."""
    if axis == -1 or y.ndim == x.ndim:
        return y
    shape = [1] * axis + list(y.shape) + [1] * (x.ndim - axis - y.ndim)
    return paddle.reshape(y, shape)


def _elementwise(fn: str) -> Callable[..., None]:
    def run(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
        x, y = _tensor(paddle, env[op.x()]), _tensor(paddle, env[op.x("Y")])
        y = _broadcast(paddle, x, y, int(op.attrs.get("axis", -1)))
        env[op.out()] = getattr(paddle, fn)(x, y)
    return run


def _unary(fn: Callable[[Any, Op, Any], Any]) -> Callable[..., None]:
    def run(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
        env[op.out()] = fn(paddle, op, env[op.x()])
    return run


def _conv(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    a = op.attrs
    algo = a.get("padding_algorithm", "EXPLICIT")
    pad: Any = algo if algo in ("SAME", "VALID") else list(a.get("paddings", [0, 0]))
    bias = env[op.ins["Bias"][0]] if op.ins.get("Bias") else None
    env[op.out("Output")] = paddle.nn.functional.conv2d(
        env[op.x("Input")], env[op.x("Filter")], bias, stride=list(a.get("strides", [1, 1])), padding=pad,
        dilation=list(a.get("dilations", [1, 1])), groups=int(a.get("groups", 1)) or 1,
        data_format=a.get("data_format", "NCHW") if a.get("data_format") in ("NCHW", "NHWC") else "NCHW")


def _batch_norm(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    a = op.attrs
    layout = a.get("data_layout", "NCHW")
    env[op.out("Y")] = paddle.nn.functional.batch_norm(
        env[op.x()], env[op.x("Mean")], env[op.x("Variance")], env[op.x("Scale")], env[op.x("Bias")],
        training=False, epsilon=float(a.get("epsilon", 1e-5)), data_format=layout if layout != "AnyLayout" else "NCHW")


def _layer_norm(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    x = env[op.x()]
    begin = int(op.attrs.get("begin_norm_axis", 1))
    w = env[op.ins["Scale"][0]] if op.ins.get("Scale") else None
    b = env[op.ins["Bias"][0]] if op.ins.get("Bias") else None
    env[op.out("Y")] = paddle.nn.functional.layer_norm(x, x.shape[begin:], w, b, float(op.attrs.get("epsilon", 1e-5)))


def _matmul(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    env[op.out()] = paddle.matmul(env[op.x()], env[op.x("Y")], bool(op.attrs.get("trans_x", False)),
                                  bool(op.attrs.get("trans_y", False)))


def _dropout(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    a = op.attrs
    mode = a.get("dropout_implementation", "downgrade_in_infer")
    p = float(a.get("dropout_prob", 0.5))
    on = training and not a.get("is_test", False) and p > 0
    env[op.out()] = paddle.nn.functional.dropout(env[op.x()], p, training=on, mode=mode)


def _fill_constant(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    if op.ins.get("ShapeTensor") or op.ins.get("ShapeTensorList") or op.ins.get("ValueTensor"):
        raise InputError(f"fill_constant {op.out()}: a tensor-valued shape or value is not supported")
    from pipeline.nets.paddle_program import _PROTO_DTYPES

    dtype = _PROTO_DTYPES[int(op.attrs.get("dtype", 5))][0]
    env[op.out()] = np.full(list(op.attrs.get("shape", [1])), op.attrs.get("value", 0.0), dtype=dtype)


def _shape(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    env[op.out()] = np.asarray(env[op.x("Input")].shape, np.int32)  # dygraph: shapes are known numbers


def _slice(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    a = op.attrs
    if any(op.ins.get(s) for s in ("StartsTensor", "EndsTensor", "StartsTensorList", "EndsTensorList")):
        raise InputError(f"slice {op.out()}: tensor-valued starts/ends are not supported")
    x = env[op.x("Input")]
    index: list[Any] = [slice(None)] * len(x.shape)
    for ax, s, e in zip(a["axes"], a["starts"], a["ends"]):
        index[ax] = slice(int(s), min(int(e), int(x.shape[ax])))
    y = x[tuple(index)]
    dec = sorted(int(d) for d in a.get("decrease_axis", []))
    if dec:
        if isinstance(y, np.ndarray):
            y = y.reshape([d for i, d in enumerate(y.shape) if i not in dec])
        else:
            y = paddle.squeeze(y, dec) if len(dec) < len(y.shape) else paddle.reshape(y, [])
    env[op.out()] = y


def _reshape(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    if op.ins.get("ShapeTensor"):
        shape = [int(np.asarray(env[n]).reshape(-1)[0]) if isinstance(env[n], np.ndarray) else int(env[n])
                 for n in op.ins["ShapeTensor"]]
    elif op.ins.get("Shape"):
        s = env[op.x("Shape")]
        shape = [int(v) for v in (s if isinstance(s, np.ndarray) else s.numpy()).reshape(-1)]
    else:
        shape = [int(v) for v in op.attrs["shape"]]
    env[op.out()] = paddle.reshape(env[op.x()], shape)


def _pool(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    a, F = op.attrs, paddle.nn.functional
    x, k = env[op.x()], list(a.get("ksize", [1, 1]))
    avg = a.get("pooling_type", "max") == "avg"
    if a.get("global_pooling"):
        k, adaptive = [1, 1], True
    else:
        adaptive = bool(a.get("adaptive"))
    if a.get("padding_algorithm", "EXPLICIT") not in ("EXPLICIT", "VALID"):
        raise InputError(f"pool2d {op.out()}: padding_algorithm {a.get('padding_algorithm')} is not supported")
    if adaptive:
        env[op.out()] = F.adaptive_avg_pool2d(x, k) if avg else F.adaptive_max_pool2d(x, k)
        return
    pad = list(a.get("paddings", [0, 0])) if a.get("padding_algorithm", "EXPLICIT") == "EXPLICIT" else 0
    stride = list(a.get("strides", k))
    if avg:
        env[op.out()] = F.avg_pool2d(x, k, stride, pad, ceil_mode=bool(a.get("ceil_mode")),
                                     exclusive=bool(a.get("exclusive", True)))
    else:
        env[op.out()] = F.max_pool2d(x, k, stride, pad, ceil_mode=bool(a.get("ceil_mode")))


def _concat(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    env[op.out()] = paddle.concat([_tensor(paddle, env[n]) for n in op.ins["X"]], axis=int(op.attrs.get("axis", 0)))


def _constant(paddle: Any, op: Op, env: dict[str, Any], training: bool) -> None:
    env[op.out()] = op.attrs["value"]  # a PIR full/full_int_array, as fill_constant: numpy until an op takes it


_OPS: dict[str, Callable[..., None]] = {
    "constant": _constant,
    "elementwise_add": _elementwise("add"), "elementwise_mul": _elementwise("multiply"),
    "elementwise_sub": _elementwise("subtract"), "elementwise_div": _elementwise("divide"),
    "conv2d": _conv, "depthwise_conv2d": _conv, "batch_norm": _batch_norm, "layer_norm": _layer_norm,
    "matmul_v2": _matmul, "dropout": _dropout, "fill_constant": _fill_constant, "shape": _shape, "slice": _slice,
    "reshape2": _reshape, "pool2d": _pool, "concat": _concat,
    "relu": _unary(lambda p, op, x: p.nn.functional.relu(x)),
    "sigmoid": _unary(lambda p, op, x: p.nn.functional.sigmoid(x)),
    "hard_swish": _unary(lambda p, op, x: x * p.clip(x + float(op.attrs.get("offset", 3.0)), 0.0,
                                                      float(op.attrs.get("threshold", 6.0)))
                         / float(op.attrs.get("scale", 6.0))),
    "hard_sigmoid": _unary(lambda p, op, x: p.nn.functional.hardsigmoid(x, float(op.attrs.get("slope", 0.2)),
                                                                         float(op.attrs.get("offset", 0.5)))),
    "swish": _unary(lambda p, op, x: x * p.nn.functional.sigmoid(float(op.attrs.get("beta", 1.0)) * x)),
    "softmax": _unary(lambda p, op, x: p.nn.functional.softmax(x, axis=int(op.attrs.get("axis", -1)))),
    "scale": _unary(lambda p, op, x: p.scale(x, float(op.attrs.get("scale", 1.0)), float(op.attrs.get("bias", 0.0)),
                                             bool(op.attrs.get("bias_after_scale", True)))),
    "assign": _unary(lambda p, op, x: x),
    "transpose2": _unary(lambda p, op, x: p.transpose(x, list(op.attrs["axis"]))),
    "flatten_contiguous_range": _unary(lambda p, op, x: p.flatten(x, int(op.attrs.get("start_axis", 1)),
                                                                  int(op.attrs.get("stop_axis", -1)))),
    "squeeze2": _unary(lambda p, op, x: p.squeeze(x, list(op.attrs.get("axes", [])) or None)),
    "unsqueeze2": _unary(lambda p, op, x: p.unsqueeze(x, list(op.attrs.get("axes", [])))),
}
