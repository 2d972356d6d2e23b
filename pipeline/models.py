"""Model builders. Called from inside a stage's `run`, after paddle has been imported.

`model.name` is a built-in name or `package.module:factory`; a factory is called as
`factory(num_classes=K, input_shape=(C, H, W))` (text: `input_shape=(max_len,)` and `vocab_size=V`)
and must return a `paddle.nn.Layer` mapping a float32 (N, C, H, W) batch (text: int64 (N, L) ids,
0 = padding) to (N, K) logits. No pretrained weights are ever downloaded.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable

from pipeline.errors import InputError

BUILTIN = ("digits_cnn", "mlp", "resnet18", "mobilenet_v3_small", "text_cnn", "bigru", "transformer", "text_fasttext")
TEXT = ("text_cnn", "bigru", "transformer", "text_fasttext")


def build(name: str, num_classes: int, input_shape: tuple[int, ...], vocab_size: int | None = None) -> Any:
    import paddle

    if ":" in name:
        factory = import_factory(name, "--model")
        extra = {"vocab_size": vocab_size} if vocab_size else {}
        model = factory(num_classes=num_classes, input_shape=tuple(input_shape), **extra)
        if not isinstance(model, paddle.nn.Layer):
            raise InputError(f"--model {name}: factory returned {type(model).__name__}, not a paddle.nn.Layer")
        return model
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
    if name in ("resnet18", "mobilenet_v3_small"):
        c, h, w = input_shape
        if c != 3 or min(h, w) < 32:
            raise InputError(f"--model {name}: needs 3-channel input of at least 32x32, data is {c}x{h}x{w}")
        from paddle.vision import models as vm

        return getattr(vm, name)(pretrained=False, num_classes=num_classes)
    raise InputError(f"--model {name}: unknown model (built in: {', '.join(BUILTIN)}, or package.module:factory)")


def import_factory(spec: str, flag: str) -> Callable[..., Any]:
    """`package.module:factory` -> the callable, resolved from the working directory as `python -m` does.

    The `pipe` console script runs with its own directory, not the cwd, as sys.path[0], so a
    project's `examples.custom.model:build` would not import without this (also used by data.py)."""
    mod_name, _, fn_name = spec.partition(":")
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        factory = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError, ValueError) as e:  # ValueError: empty module name
        raise InputError(f"{flag} {spec}: cannot import ({e})") from None
    if not callable(factory):
        raise InputError(f"{flag} {spec}: {fn_name} is not callable")
    return factory


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


_TEXT_BUILDERS = {"text_cnn": _text_cnn, "bigru": _bigru, "transformer": _transformer, "text_fasttext": _text_fasttext}
