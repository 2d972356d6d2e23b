"""An exported legacy Paddle program as a trainable dygraph layer: how `pipe train --init` fine-tunes an import.

    layer = program_layer.build(paddle, Path("RUN/export/legacy/model"))   # .pdmodel + .pdiparams
    probs = layer(x)                                                        # the program's one output
    program_layer.write_params(src_params, dest_params, layer.values())     # the fine-tuned weights, in place

Why not the other routes (facts §17): `paddle.jit.load` of the program gives a layer whose parameters get no
gradient (234 of 234 None); training the loaded program in static graph works but is a second trainer, with
its own optimizer, data parallelism, AMP, checkpoints and resume. This layer runs the program's ops one by one
as dygraph calls (`paddle.nn.functional`), with every persistable variable a parameter (a buffer for
batch-norm statistics, which stay frozen: the program was saved with is_test, and its batches of a few lines
would make poor statistics). So the one trainer (stages/train.py) trains it as any other `nn.Layer`:
DataParallel, auto_cast, the optimizer's state, state_dict checkpoints.

The ops are the program's, read from its ProgramDesc with Paddle's generated protobuf module (as
paddle_program reads it): the op types PaddleOCR's exported recognizers use (PP-OCRv4 rec: 25 types, 323
ops). An op type this does not know is refused in one line before anything is built. Dropout runs as
the program declares it when training and is the identity in eval (`upscale_in_train`).

Going back: `write_params` writes a `.pdiparams` beside the untouched `.pdmodel` with every tensor's header
as it was and its bytes the layer's, so what comes out of training is the same kind of program as what
went in, and `pipe import`'s path (PIR translation, ONNX, parity, scoring) takes it unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline import paddle_program
from pipeline.errors import InputError

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
    """The layer over `<prefix>.pdmodel` + `<prefix>.pdiparams` (a legacy program, e.g. an import's legacy/)."""
    prog = paddle_program.Program(Path(f"{prefix}.pdmodel"), Path(f"{prefix}.pdiparams"))
    io_ = paddle_program.read(prog)
    ops, feeds, fetches = read_ops(prog.program)
    unknown = sorted({o.type for o in ops} - set(_OPS))
    if unknown:
        raise InputError(f"{prog.program}: pipe train cannot run op(s) {', '.join(unknown)} of this program "
                         f"(it runs {len(_OPS)} op types: pipeline/program_layer.py)")
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
    from pipeline.paddle_program import _PROTO_DTYPES

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


_OPS: dict[str, Callable[..., None]] = {
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
