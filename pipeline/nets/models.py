"""Model builders. Called from inside a stage's `run`, after paddle has been imported.

`model.name` is a built-in name or `package.module:factory`; a factory is called as
`factory(num_classes=K, input_shape=(C, H, W))` (text: `input_shape=(max_len,)` and `vocab_size=V`)
and must return a `paddle.nn.Layer` mapping a float32 (N, C, H, W) batch (text: int64 (N, L) ids,
0 = padding) to (N, K) logits. No pretrained weights are ever downloaded.

Several named inputs (pipeline/data.py): `input_shape` is the first input's per-sample shape, and a factory
that takes an `input_shapes` parameter (or **kwargs) also gets every input's, `{name: shape}`.

How a model is called (`calling`): by keyword, `net(**feeds)`, when its forward has a parameter named after
every input (a forward taking only **kwargs too); positionally in the interface's input order when it names
none of them (nn.Sequential's `input`); naming some but not all is refused.

What a model returns (`outputs`): a tensor, a tuple (or list) or a dict of tensors. Outputs are named and
ordered as `paddle.jit.save` will list them (it drops a dict's keys and flattens it in SORTED key order; a
tuple keeps its order): a tensor is `logits`; a tuple's elements are `output_0..output_<k-1>` in order; a
dict's are its keys, sorted. Classification reads the logits from the output `model.logits_output` names,
else the one named `logits`, else the only output; otherwise (or naming no output) one line lists them.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pipeline import iospec
from pipeline.errors import InputError

BUILTIN = ("digits_cnn", "mlp", "resnet18", "mobilenet_v3_small", "text_cnn", "bigru", "transformer", "text_fasttext",
           "ernie_tiny", "centernet_tiny")
TEXT = ("text_cnn", "bigru", "transformer", "text_fasttext", "ernie_tiny")
# Built-in models whose inputs are not the one input `x` (their data: data.text_inputs).
_INPUTS = {"ernie_tiny": ("input_ids", "token_type_ids"), "centernet_tiny": ("image",)}


def build(name: str, num_classes: int, input_shape: tuple[int, ...], vocab_size: int | None = None,
          input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> Any:
    """The model for `num_classes` classes. `input_shape`: the (first) input's per-sample shape;
    `input_shapes`: every input's, by name, where the caller knows them (a factory taking it gets it)."""
    import paddle

    if ":" in name:
        factory = import_factory(name, "--model")
        extra: dict[str, Any] = {"vocab_size": vocab_size} if vocab_size else {}
        if input_shapes is not None and _takes(factory, "input_shapes"):
            extra["input_shapes"] = {k: tuple(v) for k, v in input_shapes.items()}
        model = factory(num_classes=num_classes, input_shape=tuple(input_shape), **extra)
        if not isinstance(model, paddle.nn.Layer):
            raise InputError(f"--model {name}: factory returned {type(model).__name__}, not a paddle.nn.Layer")
        return model
    if name in _INPUTS and input_shapes is not None and tuple(input_shapes) != _INPUTS[name]:
        raise InputError(f"--model {name}: takes inputs {', '.join(_INPUTS[name])}, the data gives "
                         f"{', '.join(input_shapes)}; "
                         + ("set data.text_inputs=ernie" if name == "ernie_tiny" else "use detection data (data.source "
                            "shapes or a COCO folder)"))
    if name not in _INPUTS and input_shapes is not None and len(input_shapes) != 1:
        raise InputError(f"--model {name}: a built-in model takes one input, the data has {len(input_shapes)} "
                         f"({', '.join(input_shapes)}); use a package.module:factory model")
    if (name in TEXT) != bool(vocab_size):
        kind = "text" if vocab_size else "image"
        raise InputError(f"--model {name}: not a model for {kind} data "
                         f"({'text: ' + ', '.join(TEXT) if vocab_size else 'text models need text data'})")
    if name in TEXT:
        return _TEXT_BUILDERS[name](vocab_size, num_classes, int(input_shape[0]))
    if name == "digits_cnn":
        return _digits_cnn(num_classes, input_shape[0])
    if name == "mlp":
        return _mlp(num_classes, input_shape)
    if name == "centernet_tiny":  # detection (model.task detection): three raw heads, tasks/detection/detector.py
        c, h, w = input_shape
        if h % 16 or w % 16:
            raise InputError(f"--model {name}: needs image sides that are multiples of 16, data is {c}x{h}x{w} "
                             "(set data.image_size)")
        from pipeline.tasks.detection import detector

        return detector.centernet_tiny(num_classes, c)
    if name in ("resnet18", "mobilenet_v3_small"):
        c, h, w = input_shape
        if c != 3 or min(h, w) < 32:
            raise InputError(f"--model {name}: needs 3-channel input of at least 32x32, data is {c}x{h}x{w}")
        from paddle.vision import models as vm

        return getattr(vm, name)(pretrained=False, num_classes=num_classes)
    raise InputError(f"--model {name}: unknown model (built in: {', '.join(BUILTIN)}, or package.module:factory)")


def import_object(spec: str, flag: str) -> Any:
    """`package.module:name` -> the object, resolved from the working directory as `python -m` does.

    The `pipe` console script runs with its own directory, not the cwd, as sys.path[0], so a
    project's `examples.custom.model:build` would not import without this (also used by data.py and
    pipeline/tasks for model.task)."""
    mod_name, _, name = spec.partition(":")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return getattr(importlib.import_module(mod_name), name)
    except (ImportError, AttributeError, ValueError) as e:  # ValueError: empty module name
        raise InputError(f"{flag} {spec}: cannot import ({e})") from None


def import_factory(spec: str, flag: str) -> Callable[..., Any]:
    """`package.module:factory` -> the callable (`import_object`)."""
    factory = import_object(spec, flag)
    if not callable(factory):
        raise InputError(f"{flag} {spec}: {spec.partition(':')[2]} is not callable")
    return factory


def _takes(fn: Callable[..., Any], param: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return param in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


# ------------------------------------------------------------------ calling a model, reading its outputs

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Call:
    """How a model is fed its named inputs (see the module docstring). `spec_order`: the input names in the
    order forward's parameters list them, the order of a `paddle.jit.save` input_spec list."""

    names: tuple[str, ...]  # the interface's order
    keyword: bool
    spec_order: tuple[str, ...]

    def split(self, feeds: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """(args, kwargs) for `feeds`; also what PaddleSlim's Distill passes on to both models."""
        if self.keyword:
            return (), {n: feeds[n] for n in self.names}
        return tuple(feeds[n] for n in self.names), {}

    def __call__(self, net: Any, feeds: Mapping[str, Any]) -> Any:
        args, kwargs = self.split(feeds)
        return net(*args, **kwargs)


def calling(net: Any, names: Sequence[str], where: str) -> Call:
    """The rule of the module docstring, decided once from `net.forward`'s signature."""
    names = tuple(names)
    try:
        params = list(inspect.signature(net.forward).parameters.values())
    except (TypeError, ValueError):
        return Call(names, False, names)
    kinds = inspect.Parameter
    by_name = [p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    positional = [p for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is kinds.VAR_POSITIONAL for p in params)
    varkw = any(p.kind is kinds.VAR_KEYWORD for p in params)
    sig = f"forward({', '.join(p.name for p in params)})"
    hits = [n for n in names if n in by_name]
    if len(hits) == len(names):
        return Call(names, True, tuple(sorted(names, key=by_name.index)))
    if hits:
        missing = next(n for n in names if n not in by_name)
        raise InputError(f"{where}: {sig} takes input {hits[0]!r} by name but not {missing!r}; name its parameters "
                         f"after every input ({', '.join(names)}) or after none of them")
    if varkw and not positional and not varargs:
        return Call(names, True, names)
    required = [p for p in positional if p.default is kinds.empty]
    if len(required) > len(names) or (len(positional) < len(names) and not varargs):
        raise InputError(f"{where}: {sig} takes {len(positional)} positional inputs, the data gives {len(names)} "
                         f"({', '.join(names)}); name forward's parameters after the inputs")
    return Call(names, False, names)


@dataclass(frozen=True)
class Outputs:
    """A model's return value as named outputs (module docstring): `names` in the order export will see
    them, `logits` the one classification reads."""

    kind: str  # "tensor", "sequence" or "dict"
    names: tuple[str, ...]
    logits: str

    def named(self, out: Any) -> dict[str, Any]:
        if self.kind == "tensor":
            return {self.names[0]: out}
        if self.kind == "dict":
            return {k: out[k] for k in self.names}
        return dict(zip(self.names, out))

    def logits_of(self, out: Any) -> Any:
        if self.kind == "tensor":
            return out
        if self.kind == "dict":
            return out[self.logits]
        return out[self.names.index(self.logits)]


def outputs(out: Any, logits_output: str | None, where: str) -> Outputs:
    """How to read `out`, one model call's return value; `logits_output` is model.logits_output (None: the
    task reads no logits)."""
    import paddle

    if isinstance(out, paddle.Tensor):
        kind, named = "tensor", {"logits": out}
    elif isinstance(out, dict):
        bad = next((k for k in out if not isinstance(k, str) or not _NAME.fullmatch(k)), None)
        if bad is not None:
            raise InputError(f"{where}: output name {bad!r} must be an identifier (letters, digits, _)")
        kind, named = "dict", {k: out[k] for k in sorted(out)}
    elif isinstance(out, (tuple, list)):
        kind, named = "sequence", {f"output_{i}": t for i, t in enumerate(out)}
    else:
        raise InputError(f"{where}: the model returned {type(out).__name__}; return a tensor, a tuple or a dict "
                         "of tensors")
    if not named:
        raise InputError(f"{where}: the model returned no outputs")
    bad = next((k for k, t in named.items() if not isinstance(t, paddle.Tensor)), None)
    if bad is not None:
        raise InputError(f"{where}: output {bad!r} is a {type(named[bad]).__name__}, not a tensor; return a tensor, "
                         "a tuple or a dict of tensors")
    names = tuple(named)
    if logits_output is None:  # a task that reads no logits (detection, a user's): the outputs by name only
        return Outputs(kind, names, "")
    if logits_output:
        if logits_output not in names:
            raise InputError(f"model.logits_output {logits_output!r}: the model's outputs are {', '.join(names)}")
        logits = logits_output
    elif "logits" in names or len(names) == 1:
        logits = "logits" if "logits" in names else names[0]
    else:
        raise InputError(f"{where}: the model returns {len(names)} outputs ({', '.join(names)}), none named logits; "
                         "set model.logits_output to the one classification reads")
    return Outputs(kind, names, logits)


def probe(net: Any, call: Call, feeds: Sequence[Mapping[str, Any]], logits_output: str | None,
          where: str) -> tuple[Outputs, tuple[iospec.Tensor, ...]]:
    """Call `net` on each of `feeds` (numpy arrays by input name) in eval mode without gradients (no RNG drawn,
    no BatchNorm statistics moved): its outputs named (`outputs`) and described for the interface, each with
    the dtype and shape measured (-1 for the batch and for an axis whose size differs between the calls),
    the logits role marked where there are several outputs (one output is the logits: every single-output
    interface stays as it was). The task checks what it reads (`tasks.check_outputs`)."""
    import paddle

    was_training = net.training
    net.eval()
    with paddle.no_grad():
        results = [call(net, {k: paddle.to_tensor(v) for k, v in f.items()}) for f in feeds]
    if was_training:
        net.train()
    outs = outputs(results[0], logits_output, where)
    measured = [outs.named(r) for r in results]
    described = []
    for name in outs.names:
        shapes = [list(m[name].shape) for m in measured]
        dtype = _dtype(measured[0][name])
        if dtype not in iospec.DTYPES:
            raise InputError(f"{where}: output {name!r} is {dtype}; an output is one of {', '.join(iospec.DTYPES)}")
        shape = (-1, *(d if all(s[i] == d for s in shapes) else -1 for i, d in enumerate(shapes[0]) if i))
        role = iospec.LOGITS if name == outs.logits and len(outs.names) > 1 else ""
        described.append(iospec.Tensor(name, dtype, shape, role=role))
    return outs, tuple(described)


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("paddle.", "")


def _digits_cnn(num_classes: int, channels: int) -> Any:
    """~60k parameters: three 3x3 conv blocks with BatchNorm, global average pooling, one linear."""
    from paddle import nn

    def block(cin: int, cout: int) -> list[Any]:
        return [nn.Conv2D(cin, cout, 3, padding=1, bias_attr=False), nn.BatchNorm2D(cout), nn.ReLU()]

    return nn.Sequential(
        *block(channels, 32), *block(32, 64), nn.MaxPool2D(2),
        *block(64, 96), nn.AdaptiveAvgPool2D(1), nn.Flatten(), nn.Linear(96, num_classes),
    )


def _mlp(num_classes: int, input_shape: tuple[int, ...]) -> Any:
    """No BatchNorm, no dropout: data-parallel runs match single-process runs up to float rounding."""
    from paddle import nn

    n = 1
    for d in input_shape:
        n *= int(d)
    return nn.Sequential(nn.Flatten(), nn.Linear(n, 64), nn.ReLU(), nn.Linear(64, num_classes))


# ------------------------------------------------------------------ text models (int64 ids, 0 = pad)


def _text_cnn(vocab_size: int, num_classes: int, max_len: int) -> Any:
    """Embedding + convolutions of widths 2, 3, 4 over time + max over time (Kim, 2014).

    Each convolution is written as one matmul over k shifted copies of the sequence: on Paddle's CPU
    kernels Conv1D's backward was ~5x slower than this, and Tensor.max's backward took 4.4 s on a
    (64, 160, 128) batch, so pooling uses adaptive_max_pool1d."""
    import paddle
    from paddle import nn

    widths = (2, 3, 4)

    class TextCNN(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, 64, padding_idx=0)
            self.convs = nn.LayerList([nn.Linear(k * 64, 96) for k in widths])
            self.drop = nn.Dropout(0.3)
            self.fc = nn.Linear(len(widths) * 96, num_classes)

        def forward(self, x: Any) -> Any:
            e = self.embed(x)  # (N, L, E)
            length = paddle.shape(x)[1]
            pad = paddle.zeros([paddle.shape(x)[0], max(widths) - 1, 64], e.dtype)
            e = paddle.concat([e, pad], axis=1)
            pooled = []
            for k, conv in zip(widths, self.convs):
                windows = paddle.concat([e[:, i:i + length] for i in range(k)], axis=-1)  # (N, L, k*E)
                h = nn.functional.relu(conv(windows)).transpose([0, 2, 1])  # (N, C, L)
                pooled.append(nn.functional.adaptive_max_pool1d(h, 1).squeeze(-1))
            return self.fc(self.drop(paddle.concat(pooled, axis=1)))

    return TextCNN()


def _bigru(vocab_size: int, num_classes: int, max_len: int) -> Any:
    """Embedding + one bidirectional GRU layer + masked mean pooling."""
    from paddle import nn

    class BiGRU(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, 64, padding_idx=0)
            self.gru = nn.GRU(64, 64, direction="bidirect")
            self.fc = nn.Linear(2 * 64, num_classes)

        def forward(self, x: Any) -> Any:
            out, _ = self.gru(self.embed(x))
            return self.fc(_masked_mean(out, (x != 0).astype(out.dtype)))

    return BiGRU()


def _transformer(vocab_size: int, num_classes: int, max_len: int) -> Any:
    """A small Transformer encoder: 2 post-norm layers, d=128, 4 heads, FFN 256, learned positions,
    masked mean pooling.

    Written out rather than nn.TransformerEncoder: attention and the masked mean as einsums, because
    Paddle 3.3.1's legacy (PIR off) to_static rejects the matmul and Tensor.sum that
    nn.MultiHeadAttention and a sum-based mean use, and PaddleSlim's int8 needs that legacy program."""
    import paddle
    from paddle import nn
    from paddle.nn import functional as F

    d, heads, ffn, layers = 128, 4, 256, 2

    class Attention(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)
            self.drop = nn.Dropout(0.1)

        def forward(self, h: Any, bias: Any) -> Any:
            n, length = paddle.shape(h)[0], paddle.shape(h)[1]
            qkv = self.qkv(h).reshape([n, length, 3, heads, d // heads])
            q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (N, L, H, D/H)
            scores = paddle.einsum("nqhd,nkhd->nhqk", q, k) * (d // heads) ** -0.5 + bias
            a = self.drop(F.softmax(scores, axis=-1))
            return self.out(paddle.einsum("nhqk,nkhd->nqhd", a, v).reshape([n, length, d]))

    class Layer(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.attn = Attention()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff1, self.ff2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
            self.drop = nn.Dropout(0.1)

        def forward(self, h: Any, bias: Any) -> Any:
            h = self.norm1(h + self.drop(self.attn(h, bias)))
            return self.norm2(h + self.drop(self.ff2(self.drop(F.relu(self.ff1(h))))))

    class Encoder(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d, padding_idx=0)
            self.pos = nn.Embedding(max_len, d)
            self.layers = nn.LayerList([Layer() for _ in range(layers)])
            self.norm = nn.LayerNorm(d)
            self.fc = nn.Linear(d, num_classes)

        def forward(self, x: Any) -> Any:
            positions = paddle.arange(paddle.shape(x)[1], dtype="int64").unsqueeze(0)
            h = self.embed(x) + self.pos(positions)
            keep = (x != 0).astype(h.dtype)  # (N, L): 1 = token, 0 = padding
            bias = ((1.0 - keep) * -1e4).unsqueeze(1).unsqueeze(1)  # added to the attention scores
            for layer in self.layers:
                h = layer(h, bias)
            return self.fc(_masked_mean(self.norm(h), keep))

    return Encoder()


def _masked_mean(h: Any, keep: Any) -> Any:
    """Mean of h (N, L, E) over the positions where keep (N, L) is 1, as einsums (no Tensor.sum or
    matmul: the legacy program rejects them; no 1-D pool: oneDNN bf16 rejects it)."""
    import paddle

    total = paddle.einsum("nle,nl->ne", h, keep)
    count = paddle.einsum("nl,nl->n", keep, keep).unsqueeze(-1)  # keep is 0/1
    return total / paddle.clip(count, min=1e-6)


def _hashed_ngrams(x: Any, n: int, buckets: int) -> Any:
    """Ids in [1, buckets] of the character n-grams starting at each position, 0 where the n-gram
    runs into padding or past the end: (N, L) int64 -> (N, L) int64, computed inside the graph so
    the model's input stays the character ids. Reduced mod `buckets` at each step to stay in int64.

    The constants are int64 tensors, not Python numbers: `tensor * 1000003` becomes a `scale` op,
    which paddle2onnx converts through float32, and the ids came out off by one or two in ONNX."""
    import paddle

    prime, mod, one = (paddle.full([1], v, "int64") for v in (1000003, buckets, 1))
    length = paddle.shape(x)[1]
    xp = paddle.concat([x, paddle.zeros([paddle.shape(x)[0], n - 1], x.dtype)], axis=1)  # never a 0-length slice
    h = xp[:, 0:length]
    valid = (h != 0).astype("int64")
    for i in range(1, n):
        nxt = xp[:, i:i + length]
        h = paddle.remainder(h * prime + nxt, mod)
        valid = valid * (nxt != 0).astype("int64")  # not logical_and: the legacy (non-PIR) to_static rejects it
    return (h + one) * valid


def _text_fasttext(vocab_size: int, num_classes: int, max_len: int) -> Any:
    """fastText-style bag of characters (Joulin et al., 2016): an embedding of every character, of every
    character bigram and of every character trigram, the n-grams hashed inside the model into 50,021
    buckets each (so the input is still int64 ids), a masked mean over all of them, dropout, one linear
    layer. ~6.6M parameters at a 3.6k-character vocabulary.

    Order-blind beyond trigrams, and padding-invariant: trailing [PAD] ids change no output. On
    chinese_sentiment: 83.8-84.2% test over 3 seeds against 82.6-83.0% with characters + bigrams alone
    (20,011 buckets, 1.5M parameters), ~50 s of training on 2 cores; a char 1-3-gram TF-IDF + logistic
    regression scores 83.8%. Label smoothing, 8 epochs, 200k buckets, dim 128, an MLP head, max pooling
    or three averaged models moved test accuracy by < 0.5 point; max pooling also made epochs ~3x
    slower and cost PaddleSlim int8 5.8 points."""
    import paddle
    from paddle import nn

    dim, buckets = 64, 50021

    class FastText(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.unigram = nn.Embedding(vocab_size, dim, padding_idx=0)
            self.bigram = nn.Embedding(buckets + 1, dim, padding_idx=0)
            self.trigram = nn.Embedding(buckets + 1, dim, padding_idx=0)
            self.drop = nn.Dropout(0.3)
            self.fc = nn.Linear(dim, num_classes)

        def forward(self, x: Any) -> Any:
            bi, tri = _hashed_ngrams(x, 2, buckets), _hashed_ngrams(x, 3, buckets)
            e = paddle.concat([self.unigram(x), self.bigram(bi), self.trigram(tri)], axis=1)  # (N, 3L, E)
            keep = paddle.concat([(ids != 0).astype(e.dtype) for ids in (x, bi, tri)], axis=1)
            return self.fc(self.drop(_masked_mean(e, keep)))

    return FastText()


def _ernie_tiny(vocab_size: int, num_classes: int, max_len: int) -> Any:
    from pipeline.nets import ernie

    return ernie.build_ernie_tiny(vocab_size, num_classes, max_len)


_TEXT_BUILDERS = {"text_cnn": _text_cnn, "bigru": _bigru, "transformer": _transformer, "text_fasttext": _text_fasttext,
                  "ernie_tiny": _ernie_tiny}
