"""The OCR benchmark's peer: RapidOCR's own text recognizer (rapidocr-onnxruntime 1.4.4, PP-OCRv4 rec converted
to ONNX, on onnxruntime), in-process, on the same line images pipe reads. Run by pipeline/bench/ocr.py with
the interpreter of its own venv (.venv/rapidocr, made by `make bench`: it needs numpy 2 and opencv 5, which
pipe's venv pins otherwise); imports nothing of pipe's.

    .venv/rapidocr/bin/python pipeline/bench/rapidocr_peer.py LIST.json   # {"images": [png paths]}

Prints one JSON line: {"texts", "scores", "batch_s" (all lines in RapidOCR's own batches of its default
rec_batch_num, sorted by aspect ratio), "single_s" (every line alone), "rec_batch_num", "versions"}.
Images are read by RapidOCR's own loader, as its users feed it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(path: str) -> int:
    import numpy as np
    import onnxruntime
    import rapidocr_onnxruntime as ro
    from rapidocr_onnxruntime.ch_ppocr_rec import TextRecognizer
    from rapidocr_onnxruntime.utils import LoadImage, read_yaml

    files = json.loads(Path(path).read_text())["images"]
    root = Path(ro.__file__).parent
    cfg = read_yaml(str(root / "config.yaml"))["Rec"]
    cfg["model_path"] = str(root / cfg["model_path"])
    rec = TextRecognizer(cfg)
    load = LoadImage()
    imgs = [load(f) for f in files]
    rec(imgs)  # warm-up, as pipe's engines get: every width once
    t0 = time.perf_counter()
    res, _ = rec(imgs)
    batch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for img in imgs:
        rec([img])
    single_s = time.perf_counter() - t0
    print(json.dumps({"texts": [r[0] for r in res], "scores": [float(r[1]) for r in res], "batch_s": batch_s,
                      "single_s": single_s, "rec_batch_num": cfg["rec_batch_num"],
                      "versions": {"rapidocr_onnxruntime": "1.4.4", "onnxruntime": onnxruntime.__version__,
                                   "numpy": np.__version__}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
