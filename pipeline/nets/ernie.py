"""ernie_tiny: a small encoder of ERNIE's shape with two named int64 inputs, and the text feature rule
that feeds it. No paddle import at module level (STYLE §11): `build_ernie_tiny` imports it.

    from pipeline.nets import ernie
    net = ernie.build_ernie_tiny(vocab_size=3648, num_classes=2, max_len=160)
    feeds = ernie.text_feeds(ids)                      # ids: (N, L) int64 from data.encode_texts, 0 = [PAD]
    logits = net(**{k: paddle.to_tensor(v) for k, v in feeds.items()})    # (N, num_classes)

Architecture (post-LN, as ERNIE 1.0/3.0 and BERT): the sum of word, position and token-type embeddings,
LayerNorm, dropout; `layers` Transformer layers (multi-head self-attention with the padding mask
`input_ids == 0` added to the scores as -1e4, GELU feed-forward of 4 x hidden, each sub-layer
`LayerNorm(h + dropout(f(h)))`); the first position pooled through Linear + tanh; dropout; a linear
classifier. The char vocabulary has no [CLS], so the model prepends its own: a learned vector at
position 0 (its position embedding included, no token type), which only the pooler reads. `input_ids`
are therefore the text's characters alone, and position embeddings cover `max_len + 1` positions.

Written for every export route, including the legacy (PIR off) program PaddleSlim's int8 needs. In
Paddle 3.3.1 paddle.matmul, tanh, gelu, sigmoid, exp, sum and logical_* have no legacy-mode branch
(`tanh(): argument (position 1) must be Value, but got Variable`; notes/paddle-stack-facts.md §14,
§16), so: attention and its weighted sum are einsums (as models._transformer), GELU is its erf formula
(`paddle.erf` has a legacy branch; F.gelu's exact form), tanh is a two-way softmax
(`softmax([x, -x])[0] - softmax([x, -x])[1] = tanh(x)` exactly; paddle.stanh has a legacy branch but
paddle2onnx 2.1.0 aborts on it). No global patching of paddle. OpenVINO cannot read this legacy
program (its Paddle frontend has no einsum or erf: `No creator found for einsum node`, as for the
built-in transformer); it reads the ONNX.

Measured on chinese_sentiment (12,153 training texts, batch 64, AdamW 2e-3, cosine, 1 thread, 2 shared
cores under load from other jobs): max_len 160 takes 160-230 s per epoch (~0.85 s a step; hidden 128 and
4 heads was 2.3 s a step), 81.5% test after 3 epochs; max_len 64 takes ~50 s per epoch, 79.8% after 4.
The cost is the padding: the median text has 46 characters. Since trailing [PAD] changes no logit, training
batches of similar length cut to their longest row is exact; at max_len 160 that took 50-62 s per epoch,
81.3% after 3 epochs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.errors import InputError

INPUT_NAMES = ("input_ids", "token_type_ids")
PAD_ID = 0
TYPE_VOCAB_SIZE = 2  # token types (segments) ernie_tiny embeds, as ERNIE: 0 and 1


def interface_inputs() -> list[dict[str, Any]]:
    """The model's inputs as a manifest interface lists them (pipeline/iospec.py): int64, dynamic batch
    and sequence length, in forward's order."""
    return [{"name": n, "dtype": "int64", "shape": [-1, -1]} for n in INPUT_NAMES]


def input_specs(paddle: Any) -> list[Any]:
    """The named InputSpecs for `paddle.jit.to_static`/`jit.save`: the program's input names are these,
    in this order, with batch and sequence length dynamic."""
    return [paddle.static.InputSpec([None, None], "int64", n) for n in INPUT_NAMES]


def text_feeds(ids: np.ndarray) -> dict[str, np.ndarray]:
    """The text feature rule for two-input text models: the char encoder's ids (N, L), int64, [PAD] = 0,
    as they come from `data.encode_texts` (training) or the server's tokenizer, become
    `{"input_ids": ids, "token_type_ids": zeros}`. Single-sentence classification has one segment, so
    every token type is 0, padding included (the model masks padding by `input_ids == 0` alone).
    No [CLS]/[SEP] ids are added: ernie_tiny prepends its own [CLS] inside the graph."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.ndim != 2:
        raise InputError(f"text_feeds: expected ids of shape (N, L), got {list(ids.shape)}")
    return {"input_ids": ids, "token_type_ids": np.zeros_like(ids)}


def build_ernie_tiny(vocab_size: int, num_classes: int, max_len: int, type_vocab_size: int = TYPE_VOCAB_SIZE,
                     hidden: int = 64, layers: int = 2, heads: int = 2, dropout: float = 0.1) -> Any:
    """ernie_tiny for a `vocab_size` char vocabulary ([PAD] = 0) and texts of up to `max_len` ids:
    forward(input_ids, token_type_ids), both int64 (N, L) with L <= max_len, -> logits (N, num_classes).
    Feed-forward width 4 x hidden, as ERNIE. The defaults have 348,354 parameters at chinese_sentiment's
    3,648 characters and max_len 160 (233,472 of them the word embeddings)."""
    import paddle
    from paddle import nn
    from paddle.nn import functional as F

    if hidden % heads:
        raise InputError(f"ernie_tiny: hidden {hidden} is not a multiple of heads {heads}")
    d, dh, ffn = hidden, hidden // heads, 4 * hidden

    class Attention(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)
            self.drop = nn.Dropout(dropout)

        def forward(self, h: Any, bias: Any) -> Any:
            n, length = paddle.shape(h)[0], paddle.shape(h)[1]
            qkv = self.qkv(h).reshape([n, length, 3, heads, dh])
            # split, not qkv[:, :, i]: each slice's backward fills a zero tensor of qkv's size (11% of a step)
            q, k, v = (t.squeeze(2) for t in paddle.split(qkv, 3, axis=2))  # (N, L, H, Dh)
            scores = paddle.einsum("nqhd,nkhd->nhqk", q * dh ** -0.5, k) + bias
            a = self.drop(F.softmax(scores, axis=-1))
            return self.out(paddle.einsum("nhqk,nkhd->nqhd", a, v).reshape([n, length, d]))

    class Layer(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.attn = Attention()
            self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.ff1, self.ff2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
            self.drop = nn.Dropout(dropout)

        def forward(self, h: Any, bias: Any) -> Any:
            h = self.norm1(h + self.drop(self.attn(h, bias)))
            return self.norm2(h + self.drop(self.ff2(_gelu(paddle, self.ff1(h)))))

    class ErnieTiny(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.word = nn.Embedding(vocab_size, d, padding_idx=PAD_ID)
            self.position = nn.Embedding(max_len + 1, d)  # + 1: the [CLS] in front
            self.token_type = nn.Embedding(type_vocab_size, d)
            self.cls = self.create_parameter([d], default_initializer=nn.initializer.Normal(std=0.02))
            self.norm = nn.LayerNorm(d)
            self.drop = nn.Dropout(dropout)
            self.layers = nn.LayerList([Layer() for _ in range(layers)])
            self.pooler = nn.Linear(d, d)
            self.classifier = nn.Linear(d, num_classes)

        def forward(self, input_ids: Any, token_type_ids: Any) -> Any:
            n, length = paddle.shape(input_ids)[0], paddle.shape(input_ids)[1]
            tokens = self.word(input_ids) + self.token_type(token_type_ids)  # (N, L, D)
            cls = paddle.zeros([n, 1, d], tokens.dtype) + self.cls  # a dynamic-batch broadcast legacy mode takes
            positions = paddle.arange(length + 1, dtype="int64").unsqueeze(0)
            h = self.drop(self.norm(paddle.concat([cls, tokens], axis=1) + self.position(positions)))
            keep = paddle.concat([paddle.ones([n, 1], h.dtype), (input_ids != PAD_ID).astype(h.dtype)], axis=1)
            bias = ((1.0 - keep) * -1e4).unsqueeze(1).unsqueeze(1)  # (N, 1, 1, L + 1), added to the scores
            for layer in self.layers:
                h = layer(h, bias)
            pooled = _tanh(paddle, self.pooler(h[:, 0]))
            return self.classifier(self.drop(pooled))

    return ErnieTiny()


def _gelu(paddle: Any, x: Any) -> Any:
    """Exact GELU, x * Phi(x) with the erf form: F.gelu has no legacy-mode branch, paddle.erf has."""
    return x * 0.5 * (1.0 + paddle.erf(x * 0.7071067811865476))


def _tanh(paddle: Any, x: Any) -> Any:
    """tanh(x) = (e^x - e^-x) / (e^x + e^-x) = p0 - p1 for p = softmax([x, -x]): paddle.tanh has no
    legacy-mode branch, softmax and stack have, and every engine runs them (paddle.stanh does not convert
    to ONNX)."""
    p = paddle.nn.functional.softmax(paddle.stack([x, -x], axis=-1), axis=-1)
    return p[..., 0] - p[..., 1]
