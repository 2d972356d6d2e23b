"""The README.md `pipe package` writes into a package: how to serve it and call it (curl, Python, the
Paddle Serving client, tritonclient on /v2, Triton), generated from the package's serving.yaml so its
examples match the model's input. It documents `pipe serve`'s API, so it lives beside the server's code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.serving.spec import check_vocab
from pipeline.serving.v2 import datatype

_EXAMPLE_TEXT = "这个手机很好用"


def example_ids(vocab: Path | None, text: dict[str, Any] | None) -> list[int] | None:
    """The README's example text as token ids (padding dropped: the server pads), by the training encoder."""
    if text is None:
        return None
    from pipeline import data as data_mod

    ids = data_mod.encode_texts([_EXAMPLE_TEXT], check_vocab(vocab, text), text["max_len"])[0]
    return [int(i) for i in ids[:min(len(_EXAMPLE_TEXT), text["max_len"])]]


def render(spec: dict[str, Any], inp: dict[str, Any], outp: dict[str, Any], ids: list[int] | None) -> str:
    text = spec.get("text")
    sample = list(inp["shape"][1:])
    if text is not None:
        tensor_json = json.dumps({"inputs": [ids]}, separators=(",", ":"))
        x_line = f"x = np.array([{ids}], np.int64)  # token ids of {_EXAMPLE_TEXT!r} (pipe serve pads them)"
        body_line = f"json={{\"text\": [\"{_EXAMPLE_TEXT}\", \"质量太差了，不推荐\"]}}"
    else:
        zeros = "0.0" if inp["dtype"] == "float32" else "0"
        nested = zeros
        for d in reversed(sample):
            nested = "[" + ", ".join([nested] * d) + "]"
        tensor_json = json.dumps({"inputs": [json.loads(nested)]}, separators=(",", ":"))
        x_line = (f"x = np.zeros(({', '.join(['1'] + [str(d) for d in sample])}), np.{inp['dtype']})  "
                  "# one sample, already preprocessed")
        body_line = "json={\"inputs\": x.tolist()}"
    if len(tensor_json) > 600:
        tensor_json = None
    image = spec["preprocessing"].get("kind") == "image"
    b = spec["batching"]
    lines = [
        f"# {spec['name']}: a pipe serving package",
        "",
        f"Engine {spec['model'].get('engine', 'paddle_inference')}, precision {spec['precision']}, "
        f"{spec['model']['format']} model `{spec['model']['program']}` (variant {spec['model']['variant']}). "
        f"Input `{inp['alias']}` {inp['dtype']} {inp['shape']} (first dim: batch), output `{outp['alias']}` "
        f"{outp['shape']}, {len(spec['labels'])} labels. Every file's sha256 is in `manifest.json`; "
        "`pipe serve` refuses to start if one does not match.",
        "",
    ]
    if text is not None:
        lines += [
            f"A text model: `pipe serve` encodes text with `{text['vocab_file']}` ({text['vocab_size']} entries, "
            f"one id per character, `[PAD]` = {text['pad_id']}, `[UNK]` = {text['unk_id']} for characters "
            f"it lacks) exactly as training did, truncates it to {text['max_len']} characters and pads it with "
            f"{text['pad_id']} to {text['max_len']}. Token ids sent as `inputs` are truncated and padded the same "
            "way, so a text gets the same logits alone or batched with longer or shorter ones.",
            "",
        ]
    lines += [
        "## Serve",
        "",
        "```sh",
        "pipe serve .                 # http://127.0.0.1:8000",
        "pipe serve . --port 9000 --max-batch-size 64",
        "```",
        "",
        f"Concurrent requests are batched: up to {b['max_batch_size']} samples per run, waiting at most "
        f"{b['max_wait_ms']} ms for more. Health: `GET /livez`, `GET /readyz`; metadata `GET /v1/model`; "
        "the Open Inference Protocol (KServe v2) under `/v2` (below); "
        "Prometheus metrics `GET /metrics`; the OpenAPI schema `GET /openapi.json`, and interactive docs at "
        "`GET /docs` where the `fastapi-offline` package is installed (Swagger UI served by the server "
        "itself, no CDN; without it there is no /docs page). It listens on 127.0.0.1 only unless `--host` "
        "is given: it has no authentication or TLS, so put it behind a proxy before exposing it.",
        "",
        "## curl",
        "",
        "```sh",
    ]
    if text is not None:
        lines += ["curl -s http://127.0.0.1:8000/v1/predict -H 'Content-Type: application/json' \\",
                  f"     -d '{{\"text\": [\"{_EXAMPLE_TEXT}\"]}}'"]
    if tensor_json:
        if text is not None:
            lines += [f"# the same text as token ids of {text['vocab_file']}:"]
        lines += ["curl -s http://127.0.0.1:8000/v1/predict -H 'Content-Type: application/json' \\",
                  f"     -d '{tensor_json}'"]
    if image:
        lines += ["# a PNG or JPEG, resized and normalised as at training time:",
                  "curl -s http://127.0.0.1:8000/v1/predict -H 'Content-Type: application/json' \\",
                  "     -d '{\"images\": [\"'$(base64 -w0 picture.png)'\"]}'"]
    lines += [
        "```",
        "",
        "The answer: `{\"labels\": [...], \"scores\": [...], \"logits\": [[...]]}` (one entry per sample; "
        "`scores` is the softmax probability of the label). Errors: "
        "`{\"error\": {\"code\": 422, \"type\": \"invalid_tensor\", \"message\": \"...\"}}`"
        + (" (empty text: 422 `empty_text`; a body that is not UTF-8: 400)." if text is not None else "."),
        "",
        "## Python",
        "",
        "```python",
        "import httpx" + ("" if text is not None else ", numpy as np"),
        "",
    ]
    if text is None:
        lines += [x_line]
    lines += [
        f"r = httpx.post(\"http://127.0.0.1:8000/v1/predict\", {body_line})",
        "r.raise_for_status()",
        "print(r.json()[\"labels\"])",
        "```",
        "",
        "Paddle Serving clients (`paddle-serving-client` 0.9.0, Python <= 3.9) work unchanged against "
        "`pipe serve`, in protobuf and JSON mode" + (" (token ids as int64, feed type 0):" if text is not None
                                                     else ":"),
        "",
        "```python",
        "import numpy as np",
        "from paddle_serving_client import HttpClient",
        "",
        x_line,
        "client = HttpClient()",
        "client.load_client_config(\"serving_client_conf.prototxt\")",
        "client.connect([\"127.0.0.1:8000\"])          # dotted IPv4 only",
        f"out = client.predict(feed={{\"{inp['alias']}\": x}}, fetch=[\"{outp['alias']}\"], batch=True)",
        "print(out.outputs[0].tensor[0].float_data)  # after client.set_http_proto(False): a dict",
        "```",
        "",
        "The Open Inference Protocol (KServe v2) is served at `/v2` (model `" + spec["name"] + "`, version 1): "
        "Triton's `tritonclient[http]` works unchanged, with JSON or binary tensors"
        + (", and takes the texts themselves as BYTES (UTF-8, shape [N] or [N, 1]) or int64 token ids:"
           if text is not None else ":"),
        "",
        "```python",
        "import numpy as np",
        "import tritonclient.http as httpclient",
        "",
    ]
    if text is not None:
        lines += [f"x = np.array([\"{_EXAMPLE_TEXT}\".encode(), \"质量太差了，不推荐\".encode()], np.object_)",
                  f"inp = httpclient.InferInput(\"{inp['name']}\", [2], \"BYTES\")"]
    else:
        lines += [x_line,
                  f"inp = httpclient.InferInput(\"{inp['name']}\", list(x.shape), \"{datatype(inp['dtype'])}\")"]
    lines += [
        "inp.set_data_from_numpy(x)  # binary; binary_data=False sends JSON",
        "client = httpclient.InferenceServerClient(\"127.0.0.1:8000\")",
        f"print(client.infer(\"{spec['name']}\", [inp]).as_numpy(\"{outp['name']}\").argmax(1))",
        "```",
        "",
    ]
    why = (spec.get("engine") or {}).get("why")
    if why:
        lines += ["## Why this engine", "", f"`pipe package` measured the variants on this machine and chose "
                  f"{spec['model']['variant']} on {spec['model'].get('engine')}: {why}. `pipe serve . --engine X` "
                  "runs another engine that reads these files (onnxruntime or openvino for `model.onnx`; paddle or "
                  "openvino for an fp32 `model.pdmodel`); the reference check then runs on that engine.", ""]
    if spec.get("triton"):
        t = spec["triton"]
        lines += [
            "## Triton",
            "",
            f"`triton/` is a Triton model repository (model `{t['model']}`, version 1, `backend: \"onnxruntime\"`, "
            f"ONNX from {t['onnx_source']}, with the served model's input and output names); a tritonserver with "
            "the onnxruntime backend loads it unchanged:",
            "",
            "```sh",
            "tritonserver --model-repository=$PWD/triton --http-address=127.0.0.1 --http-port=8000 "
            "--allow-grpc=false --allow-metrics=false",
            "```",
            "",
            "The v2 client code above talks to Triton and to `pipe serve` the same way (both speak the Open "
            "Inference Protocol on port 8000); KServe's v2 clients likewise.",
            "",
        ]
        if text is not None:
            lines[-1:-1] = [
                "",
                f"Triton has no tokenizer: send int64 token ids of `{text['vocab_file']}` (dims [-1]: any length), "
                f"padded with {text['pad_id']} to {text['max_len']} as `pipe serve` does to get the same logits.",
            ]
    return "\n".join(lines)
