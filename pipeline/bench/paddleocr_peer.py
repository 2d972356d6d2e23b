"""The predict benchmark's peer: PaddleOCR 3.7's own OCR pipeline (paddleocr 3.7.0, paddlex 3.7.2, paddlepaddle
3.3.1), offline, on the same three PP-OCRv4 models pipe packages (the pinned wheel's legacy programs:
pipeline/pretrained.py), in-process, over a list of page files as its users give it a folder. Run by
pipeline/bench/predict.py with the interpreter of its own venv (.venv/paddleocr, made by `make bench`: its pins
are not pipe's); imports nothing of pipe's (pipe's tests import `model_dirs` from it, which needs only PyYAML).

    .venv/paddleocr/bin/python pipeline/bench/paddleocr_peer.py LIST.json

LIST.json: {"images": [page paths], "models": {"det", "rec", "cls": the wheel's model dirs, "keys": the key
file}, "work": a folder to write the model dirs' copies in, "cpu_threads": null (PaddleOCR's default) or N,
"workaround": true (default; false runs det as PaddleX would, to see whether the bug below still bites)}.

As docs/notes (paddle-stack-facts §18) prescribe:
- each model dir is copied (its program and params linked, never the .pdiparams.info pickle) with the
  `inference.yml` PaddleOCR 3.x's exporter writes (`model_dirs`), named as PaddleX knows them;
- PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK=True before the import, local model dirs only, and an audit hook that
  refuses and records every Python-level network call (connect to anything but a Unix socket, DNS look-ups);
- the two upstream bugs stepped around: det alone on oneDNN with the old IR (`enable_new_ir: false`: Paddle
  3.3.1's new IR fails on the det program, Paddle#79749 / PaddleOCR#17869), and textline orientation at batch 1
  (PaddleX 3.7.2 gives every crop of a batch the first crop's angle).

Construction, then the first page once untimed, then every page through `PaddleOCR.predict_iter(list)` once
(what `predict` does without keeping every page's result and image), timed as one job. Prints one JSON line:
{"pages": per page [[4 [x, y]], text, score] for each line it kept, "seconds" (the timed pass), "pages_s",
"construct_s", "network" (the refused calls: [] when it stayed offline), "settings", "versions"}.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

# PaddleX's model names (it picks the predictor by them; each must equal the name given to PaddleOCR)
NAMES = {"det": "PP-OCRv4_mobile_det", "rec": "PP-OCRv4_mobile_rec", "cls": "PP-LCNet_x0_25_textline_ori"}
_FILES = ("inference.pdmodel", "inference.pdiparams")  # what Paddle Inference reads; not the .info pickle
_IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def inference_yml(role: str, keys: list[str] | None = None) -> dict[str, Any]:
    """The inference.yml PaddleOCR 3.x's exporter (ppocr/utils/export_model.py `dump_infer_config`) writes for
    the role's model, as PaddleX 3.7.2 reads it: det and rec in PaddleOCR's layout (PaddleX skips the
    training-only ops), the v2 cls in PaddleClas's (PaddleX runs a textline orientation model as a classifier)."""
    if role == "det":
        ops = [{"DecodeImage": {"channel_first": False, "img_mode": "BGR"}}, {"DetLabelEncode": None},
               {"DetResizeForTest": None},  # the limits come from the pipeline's config
               {"NormalizeImage": {**_IMAGENET, "order": "hwc", "scale": 1 / 255}}, {"ToCHWImage": None},
               {"KeepKeys": {"keep_keys": ["image", "shape", "polys", "ignore_tags"]}}]
        post = {"name": "DBPostProcess", "thresh": 0.3, "box_thresh": 0.6, "max_candidates": 1000,
                "unclip_ratio": 1.5}
    elif role == "rec":
        if not keys:
            raise ValueError("rec: the key file's characters are needed (CTCLabelDecode's character_dict)")
        ops = [{"DecodeImage": {"channel_first": False, "img_mode": "BGR"}},
               {"MultiLabelEncode": {"gtc_encode": "NRTRLabelEncode"}}, {"RecResizeImg": {"image_shape": [3, 48, 320]}},
               {"KeepKeys": {"keep_keys": ["image", "label_ctc", "label_gtc", "length", "valid_ratio"]}}]
        post = {"name": "CTCLabelDecode", "character_dict": list(keys)}  # PaddleX adds the blank and the space
    elif role == "cls":  # ch_ppocr_mobile_v2 cls: input x [N, 3, 48, 192], (x / 255 - 0.5) / 0.5, 2 classes
        ops = [{"ResizeImage": {"size": [192, 48]}},
               {"NormalizeImage": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "scale": 1 / 255, "order": ""}},
               {"ToCHWImage": None}]
        post = {"Topk": {"topk": 1, "label_list": ["0_degree", "180_degree"]}}
    else:
        raise ValueError(f"role {role!r}: det, rec or cls")
    return {"Global": {"model_name": NAMES[role]}, "PreProcess": {"transform_ops": ops}, "PostProcess": post}


def model_dirs(models: dict[str, str], work: Path) -> dict[str, Path]:
    """A copy of each of the wheel's model dirs (`models`: det, rec, cls dirs and the keys file) under `work`:
    its program and params linked, and the inference.yml PaddleX needs (the wheel's dirs have none)."""
    import yaml

    keys = Path(models["keys"]).read_text(encoding="utf-8").splitlines()
    out = {}
    for role in ("det", "rec", "cls"):
        src, dest = Path(models[role]), work / NAMES[role]
        dest.mkdir(parents=True, exist_ok=True)
        for f in _FILES:
            if not (src / f).is_file():
                raise FileNotFoundError(f"{src / f}: missing (the wheel's {role} model dir)")
            if not (dest / f).exists():
                (dest / f).symlink_to((src / f).resolve())
        doc = inference_yml(role, keys if role == "rec" else None)
        (dest / "inference.yml").write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False), encoding="utf-8")
        out[role] = dest
    return out


def guard_network() -> list[str]:
    """Refuse and record every Python-level network call from now on (an audit hook cannot be removed): the
    list the calls are appended to. Unix sockets (local IPC) pass."""
    refused: list[str] = []

    def hook(event: str, args: tuple) -> None:
        if event == "socket.connect" and getattr(args[0], "family", None) != socket.AF_UNIX:
            refused.append(f"connect {args[1]!r}")
        elif event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex"):
            refused.append(f"{event.split('.')[1]} {args[0]!r}")
        else:
            return
        raise OSError(f"paddleocr_peer: network access refused ({refused[-1]})")

    sys.addaudithook(hook)
    return refused


def main(path: str) -> int:
    refused = guard_network()
    os.environ["PADDLE_PDX_DISABLE_MODEL_SOURCE_CHECK"] = "True"  # paddlex/utils/flags.py: no hub look-up
    doc = json.loads(Path(path).read_text())
    files, threads = doc["images"], doc.get("cpu_threads")
    workaround = doc.get("workaround", True)
    dirs = model_dirs(doc["models"], Path(doc["work"]))
    t0 = time.perf_counter()
    import numpy as np
    import paddle
    import paddleocr
    import paddlex
    from paddleocr import PaddleOCR

    from paddleocr._constants import DEFAULT_CPU_THREADS, DEFAULT_MKLDNN_CACHE_CAPACITY
    from paddlex.inference import load_pipeline_config

    kwargs: dict[str, Any] = {"cpu_threads": int(threads)} if threads is not None else {}
    if workaround:  # det's engine config replaces the pipeline's whole paddle_static one: say all of it
        config = load_pipeline_config("OCR")
        config["SubModules"]["TextDetection"]["engine_config"] = {"paddle_static": {
            "run_mode": "mkldnn", "enable_new_ir": False, "cpu_threads": int(threads or DEFAULT_CPU_THREADS),
            "mkldnn_cache_capacity": DEFAULT_MKLDNN_CACHE_CAPACITY, "enable_cinn": False}}
        kwargs["paddlex_config"] = config
    ocr = PaddleOCR(text_detection_model_name=NAMES["det"], text_detection_model_dir=str(dirs["det"]),
                    text_recognition_model_name=NAMES["rec"], text_recognition_model_dir=str(dirs["rec"]),
                    textline_orientation_model_name=NAMES["cls"], textline_orientation_model_dir=str(dirs["cls"]),
                    use_doc_orientation_classify=False, use_doc_unwarping=False,
                    textline_orientation_batch_size=1, **kwargs)
    construct_s = time.perf_counter() - t0
    ocr.predict(files[:1])  # construction's last costs (first run) untimed, as pipe's engines are warmed
    t0 = time.perf_counter()
    pages = [[[np.asarray(p, float).tolist(), t, float(s)] for p, t, s in  # each page's result let go once read
              zip(r["rec_polys"], r["rec_texts"], r["rec_scores"])] for r in ocr.predict_iter(files)]
    seconds = time.perf_counter() - t0
    print(json.dumps({"pages": pages, "seconds": seconds, "pages_s": len(files) / seconds, "construct_s": construct_s,
                      "network": refused,
                      "settings": {"cpu_threads": threads if threads is not None else "default",
                                   "workaround": workaround},
                      "versions": {"paddleocr": paddleocr.__version__, "paddlex": paddlex.__version__,
                                   "paddlepaddle": paddle.__version__, "numpy": np.__version__}},
                     ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
