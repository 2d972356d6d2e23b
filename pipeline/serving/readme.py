"""The README.md `pipe package` writes into a package: how to serve it and call it (curl, Python, the
Paddle Serving client, tritonclient on /v2, Triton), generated from the package's serving.yaml so its
examples match the model's tensors: every input and output is listed, and a model of several inputs is
called on /v2 (one named tensor each) and through the Paddle Serving client (one feed each). /v1 answers
for the package's task (serving.yaml `task:`); for a task without logits (detection) it says that /v2 and
Triton serve the raw outputs and the task's postprocessing, with serving.yaml's settings, runs in the
client. It documents `pipe serve`'s API, so it lives beside the server's code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from pipeline import tasks
from pipeline.serving.spec import check_vocab
from pipeline.serving.v2 import datatype

_EXAMPLE_TEXT = "这个手机很好用"
_INLINE_LABELS = 50  # more labels than this are read from serving.yaml in the examples, not written into them


def example_ids(vocab: Path | None, text: dict[str, Any] | None) -> list[int] | None:
    """The README's example text as token ids (padding dropped: the server pads), by the training encoder."""
    if text is None:
        return None
    from pipeline import data as data_mod

    ids = data_mod.encode_texts([_EXAMPLE_TEXT], check_vocab(vocab, text), text["max_len"])[0]
    return [int(i) for i in ids[:min(len(_EXAMPLE_TEXT), text["max_len"])]]


def _zeros(t: dict[str, Any]) -> str:
    """One sample of zeros of `t` as nested JSON lists."""
    nested = "0.0" if t["dtype"] == "float32" else "0"
    for d in reversed(t["shape"][1:]):
        nested = "[" + ", ".join([nested] * d) + "]"
    return nested


def _np_zeros(t: dict[str, Any], var: str) -> str:
    return f"{var} = np.zeros(({', '.join(['1'] + [str(d) for d in t['shape'][1:]])}), np.{t['dtype']})"


def _tensor_lines(spec: dict[str, Any]) -> list[str]:
    """Every input and output: name, dtype, shape, role."""
    rows = ["| | name | dtype | shape (first dim: batch) |", "|---|---|---|---|"]
    for kind, key in (("input", "inputs"), ("output", "outputs")):
        for t in spec[key]:
            role = f" ({t['role']})" if t.get("role") else ""
            rows.append(f"| {kind}{role} | `{t['name']}` | {t['dtype']} | {t['shape']} |")
    return rows


def _task(spec: dict[str, Any]) -> dict[str, Any]:
    """serving.yaml's `task:` section (packages before it: classification)."""
    return spec.get("task") or {"name": "classification", "spec": "classification", "settings": {}}


def _logits(spec: dict[str, Any]) -> dict[str, Any] | None:
    """The logits output's entry, for a task that reads logits; None otherwise (detection)."""
    if not getattr(tasks.get(_task(spec)["spec"]), "logits", False):
        return None
    return next(t for t in spec["outputs"] if t.get("role") == "logits")


def _answer_line(spec: dict[str, Any], text: bool) -> str:
    """What /v1 answers, in words."""
    task = _task(spec)
    errors = ("Errors: `{\"error\": {\"code\": 422, \"type\": \"invalid_tensor\", \"message\": \"...\"}}`"
              + (" (empty text: 422 `empty_text`; a body that is not UTF-8: 400)." if text else "."))
    if _logits(spec) is not None:
        return ("The answer: `{\"labels\": [...], \"scores\": [...], \"logits\": [[...]]}` (one entry per sample; "
                "`scores` is the softmax probability of the label). " + errors)
    if task["name"] == "ocr_rec":
        return ("The answer: `{\"lines\": [{\"text\": \"...\", \"score\": 0.99}, ...]}`, one per image (or "
                "tensor row) in the order sent: CTC greedy decode with the package's keys, `score` the mean "
                "probability of the kept characters. " + errors)
    if task["name"] == "ocr_det":
        cfg = task["settings"]
        return ("The answer: `{\"boxes\": [[{\"points\": [[x, y], [x, y], [x, y], [x, y]], \"score\": 0.91}, "
                "...], ...]}`, one list of text boxes per page in the order sent, each 4 points clockwise from the "
                "top left in the sent page's pixels (tensors: the map's): DB post-processing with thresh "
                f"{cfg.get('thresh')}, box_thresh {cfg.get('box_thresh')}, unclip_ratio {cfg.get('unclip_ratio')} "
                "(serving.yaml `task.settings`); a page without text gets an empty list. " + errors)
    if task["name"] == "detection":
        cfg = task["settings"]
        return ("The answer: `{\"detections\": [[{\"label\": \"...\", \"score\": 0.93, \"box\": [x1, y1, x2, y2]}, "
                "...], ...]}`, one list per image, highest score first: boxes in the sent image's pixels (a PNG/JPEG "
                "is resized to the model's input and its boxes scaled back; tensors: model-input pixels), score >= "
                f"{cfg.get('score_threshold')}, class-wise NMS at IoU {cfg.get('nms_iou')}, at most "
                f"{cfg.get('max_detections')} per image (serving.yaml `task.settings`). " + errors)
    return f"The answer is task `{task['spec']}`'s (its `answer`, with serving.yaml `task.settings`). " + errors


def _postprocess(spec: dict[str, Any], var: str) -> list[str]:
    """Python lines: a task without logits' postprocessing of the raw outputs (`var`: by public name), in the
    client, with serving.yaml's settings."""
    task = _task(spec)
    if task["name"] == "detection":
        return [f"settings = {task['settings']!r}  # serving.yaml task.settings",
                "from pipeline.tasks import detection",
                f"boxes = detection.decode({var}, settings)  # per image: [x1, y1, x2, y2, score, class], "
                "model-input pixels"]
    if len(spec["labels"]) > _INLINE_LABELS:  # e.g. ocr_rec's 6,623 keys: read from serving.yaml, not inlined
        return ["import yaml",
                "from pipeline import tasks",
                "doc = yaml.safe_load(open(\"serving.yaml\", encoding=\"utf-8\"))  # in the package directory",
                "task = tasks.get(doc[\"task\"][\"spec\"])",
                f"answer = task.answer({var}, tasks.Info(tuple(doc[\"labels\"]), doc[\"task\"][\"settings\"]), None)",
                "print(answer)"]
    return ["from pipeline import tasks",
            f"task = tasks.get({task['spec']!r})",
            f"answer = task.answer({var}, tasks.Info({spec['labels']!r}, {task['settings']!r}), None)"]


def _example_sample(spec: dict[str, Any], inp: dict[str, Any]) -> list[int]:
    """The input's per-sample shape in the examples: its own, or for a task with a dynamic input (ocr_rec's
    width) the task's first example shape."""
    task = tasks.get(_task(spec)["spec"])
    if not tasks.dynamic(task):
        return list(inp["shape"][1:])
    info = tasks.Info(tuple(spec["labels"]), {**task.settings, **(_task(spec)["settings"] or {})})
    return [int(d) for d in task.example_shapes(info)[0]]


def render(spec: dict[str, Any], ids: list[int] | None) -> str:
    ins, outs = spec["inputs"], spec["outputs"]
    if len(ins) > 1 and spec.get("text") is None:
        return _render_inputs(spec)
    outp = _logits(spec)  # None: a task without logits
    text = spec.get("text")
    sample = _example_sample(spec, ins[0])
    dynamic = sample != list(ins[0]["shape"][1:])  # a task's own images, any size (ocr_rec's lines)
    inp = {**ins[0], "shape": [-1, *sample]}
    if text is not None:
        tensor_json = json.dumps({"inputs": [ids]}, separators=(",", ":"))
        x_line = f"x = np.array([{ids}], np.int64)  # token ids of {_EXAMPLE_TEXT!r} (pipe serve pads them)"
        body_line = f"json={{\"text\": [\"{_EXAMPLE_TEXT}\", \"质量太差了，不推荐\"]}}"
    else:
        tensor_json = json.dumps({"inputs": [json.loads(_zeros(inp))]}, separators=(",", ":"))
        x_line = (f"x = np.zeros(({', '.join(['1'] + [str(d) for d in sample])}), np.{inp['dtype']})  "
                  "# one sample, already preprocessed" + (" (any size up to the task's limit)" if dynamic else ""))
        body_line = "json={\"inputs\": x.tolist()}"
    if len(tensor_json) > 600:
        tensor_json = None
    image = spec["preprocessing"].get("kind") == "image" or dynamic
    lines = _head(spec)
    if text is not None:
        lines += [
            f"A text model: `pipe serve` encodes text with `{text['vocab_file']}` ({text['vocab_size']} entries, "
            f"one id per character, `[PAD]` = {text['pad_id']}, `[UNK]` = {text['unk_id']} for characters "
            f"it lacks) exactly as training did, truncates it to {text['max_len']} characters and pads it with "
            f"{text['pad_id']} to {text['max_len']}. Token ids sent as `inputs` are truncated and padded the same "
            "way, so a text gets the same logits alone or batched with longer or shorter ones.",
            "",
        ]
    lines += _serve(spec)
    lines += [
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
    if dynamic:
        lines += [f"# PNG or JPEG images of any size, prepared by task {_task(spec)['spec']} as at import:",
                  "curl -s http://127.0.0.1:8000/v1/predict -H 'Content-Type: application/json' \\",
                  "     -d '{\"images\": [\"'$(base64 -w0 picture.png)'\"]}'"]
    elif image:
        lines += ["# a PNG or JPEG, resized and normalised as at training time:",
                  "curl -s http://127.0.0.1:8000/v1/predict -H 'Content-Type: application/json' \\",
                  "     -d '{\"images\": [\"'$(base64 -w0 picture.png)'\"]}'"]
    lines += [
        "```",
        "",
        _answer_line(spec, text is not None),
        "",
        "## Python",
        "",
        "```python",
        "import httpx" + ("" if text is not None else ", numpy as np"),
        "",
    ]
    if dynamic:
        lines[-2] = "import base64, httpx"
        lines += ["png = base64.b64encode(open(\"picture.png\", \"rb\").read()).decode()"]
        body_line = "json={\"images\": [png]}"
    elif text is None:
        lines += [x_line]
    lines += [
        f"r = httpx.post(\"http://127.0.0.1:8000/v1/predict\", {body_line})",
        "r.raise_for_status()",
        "print(r.json()" + ("[\"labels\"]" if outp is not None else
                            "[\"detections\"][0]" if _task(spec)["name"] == "detection" else
                            "[\"boxes\"][0]" if _task(spec)["name"] == "ocr_det" else
                            "[\"lines\"]" if dynamic else "") + ")",
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
        f"out = client.predict(feed={{\"{inp['name']}\": x}}, fetch=["
        + ", ".join(f"\"{t['name']}\"" for t in ([outp] if outp is not None else outs)) + "], batch=True)",
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
    ]
    if outp is not None:
        lines += [f"print(client.infer(\"{spec['name']}\", [inp]).as_numpy(\"{outp['name']}\").argmax(1))"]
    else:
        lines += [f"result = client.infer(\"{spec['name']}\", [inp])",
                  "outputs = {" + ", ".join(f"\"{t['name']}\": result.as_numpy(\"{t['name']}\")" for t in outs)
                  + "}  # the raw outputs",
                  *_postprocess(spec, "outputs")]
    lines += [
        "```",
        "",
    ]
    lines += _tail(spec)
    return "\n".join(lines)


def _head(spec: dict[str, Any]) -> list[str]:
    n_in, n_out = len(spec["inputs"]), len(spec["outputs"])
    return [
        f"# {spec['name']}: a pipe serving package",
        "",
        f"Engine {spec['model'].get('engine', 'paddle_inference')}, precision {spec['precision']}, "
        f"{spec['model']['format']} model `{spec['model']['program']}` (variant {spec['model']['variant']}), "
        f"{n_in} input{'s' * (n_in > 1)} and {n_out} output{'s' * (n_out > 1)}, {len(spec['labels'])} labels. "
        "Every file's sha256 is in `manifest.json`; `pipe serve` refuses to start if one does not match.",
        "",
        "## Tensors",
        "",
        *_tensor_lines(spec),
        "",
        "Every endpoint (/v1, /v2 over HTTP and gRPC, Paddle Serving's) and the Triton repository use these "
        "names (the Paddle Serving client's alias_name).",
        "",
    ]


def _serve(spec: dict[str, Any]) -> list[str]:
    b = spec["batching"]
    return [
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
    ]


def _render_inputs(spec: dict[str, Any]) -> str:
    """A model of several (non-text) inputs: every example names each input (v2 JSON, the Paddle Serving
    client's feed dict, tritonclient's InferInputs) and reads every output."""
    ins, outs = spec["inputs"], spec["outputs"]
    logits = _logits(spec)  # None: a task without logits
    url = f"http://127.0.0.1:8000/v2/models/{spec['name']}/infer"
    body = {"inputs": [{"name": t["name"], "shape": [1, *t["shape"][1:]], "datatype": datatype(t["dtype"]),
                        "data": [0.0 if t["dtype"] == "float32" else 0] * math.prod(t["shape"][1:])} for t in ins]}
    body_json = json.dumps(body, separators=(",", ":"))
    zeros = [_np_zeros(t, f"x_{i}") + f"  # {t['name']}: one sample, already preprocessed" for i, t in enumerate(ins)]
    lines = _head(spec) + _serve(spec) + ["## curl", "", "```sh"]
    if len(body_json) <= 600:
        lines += [f"curl -s {url} -H 'Content-Type: application/json' \\", f"     -d '{body_json}'"]
    else:
        lines += [f"# POST {url} with one named tensor per input (see Python below)"]
    lines += [
        "```",
        "",
        "The answer lists every output by name (`outputs: [{name, datatype, shape, data}]`); a request's "
        "`outputs` picks some. A missing or unknown input, or one of the wrong datatype or shape: 400 with a "
        "line naming it.",
        "",
        "## Python",
        "",
        "```python",
        "import httpx, numpy as np",
        "",
        *zeros,
        "body = {\"inputs\": [",
        *(f"    {{\"name\": \"{t['name']}\", \"shape\": list(x_{i}.shape), \"datatype\": "
          f"\"{datatype(t['dtype'])}\", \"data\": x_{i}.ravel().tolist()}}," for i, t in enumerate(ins)),
        "]}",
        f"r = httpx.post(\"{url}\", json=body)",
        "r.raise_for_status()",
        "out = {o[\"name\"]: np.asarray(o[\"data\"]).reshape(o[\"shape\"]) for o in r.json()[\"outputs\"]}",
        f"print(out[\"{logits['name']}\"].argmax(1))" if logits is not None else
        "print({k: v.shape for k, v in out.items()})  # the raw outputs",
        "```",
        "",
        "Paddle Serving clients (`paddle-serving-client` 0.9.0, Python <= 3.9) work unchanged against "
        "`pipe serve`, in protobuf and JSON mode: one feed per input, by its alias_name:",
        "",
        "```python",
        "import numpy as np",
        "from paddle_serving_client import HttpClient",
        "",
        *zeros,
        "client = HttpClient()",
        "client.load_client_config(\"serving_client_conf.prototxt\")",
        "client.connect([\"127.0.0.1:8000\"])          # dotted IPv4 only",
        "out = client.predict(feed={" + ", ".join(f"\"{t['name']}\": x_{i}" for i, t in enumerate(ins))
        + "}, fetch=[" + ", ".join(f"\"{t['name']}\"" for t in outs) + "], batch=True)",
        "print(out.outputs[0].tensor[0].float_data)  # after client.set_http_proto(False): a dict",
        "```",
        "",
        "The Open Inference Protocol (KServe v2) is served at `/v2` (model `" + spec["name"] + "`, version 1): "
        "Triton's `tritonclient[http]` works unchanged, with JSON or binary tensors:",
        "",
        "```python",
        "import numpy as np",
        "import tritonclient.http as httpclient",
        "",
        *zeros,
        "inputs = []",
        *(f"inputs.append(httpclient.InferInput(\"{t['name']}\", list(x_{i}.shape), \"{datatype(t['dtype'])}\"))\n"
          f"inputs[-1].set_data_from_numpy(x_{i})  # binary; binary_data=False sends JSON" for i, t in enumerate(ins)),
        "client = httpclient.InferenceServerClient(\"127.0.0.1:8000\")",
        "result = client.infer(\"" + spec["name"] + "\", inputs)",
        (f"print(result.as_numpy(\"{logits['name']}\").argmax(1))\n" if logits is not None else "")
        + "\n".join(f"print(result.as_numpy(\"{t['name']}\").shape)" for t in outs if t is not logits),
        "```",
        "",
    ]
    lines += _tail(spec)
    return "\n".join(lines)


def _tail(spec: dict[str, Any]) -> list[str]:
    """Why this engine; the Triton repository."""
    text = spec.get("text")
    lines: list[str] = []
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
        if _logits(spec) is None:
            task = _task(spec)
            how = ("`pipeline.tasks.detection.decode(outputs, settings)` (sigmoid, 3x3 peaks, top max_detections, "
                   "score_threshold, class-wise NMS at nms_iou; boxes in model-input pixels, to be scaled to the "
                   "image as /v1 does)" if task["name"] == "detection"
                   else f"task `{task['spec']}`'s `answer`")
            lines[-1:-1] = [
                "",
                f"A {task['name']} model: Triton (and /v2 on `pipe serve`) serves the raw outputs "
                "(" + ", ".join(f"`{t['name']}`" for t in spec["outputs"]) + "), with no labels file and no "
                f"classification extension; the task's postprocessing runs in the client: {how}, with serving.yaml's "
                f"`task.settings` ({json.dumps(task['settings'])}). Only `pipe serve`'s /v1 runs it in the server.",
            ]
        if text is not None:
            others = [i["name"] for i in spec["inputs"][1:]]
            lines[-1:-1] = [
                "",
                f"Triton has no tokenizer: send int64 token ids of `{text['vocab_file']}` (dims [-1]: any length), "
                f"padded with {text['pad_id']} to {text['max_len']} as `pipe serve` does to get the same logits"
                + (f"; and {', '.join(f'`{n}`' for n in others)} as `pipe serve` makes them from the ids "
                   "(`pipeline/data.py` text_inputs)." if others else "."),
            ]
    return lines
