"""The OCR system benchmark's peer: RapidOCR 1.4.4 whole (rapidocr-onnxruntime: PP-OCRv4 det, ch_ppocr_mobile_v2
cls and PP-OCRv4 rec converted to ONNX, on onnxruntime), in-process at its default settings, on the same page
files pipe reads. Run by pipeline/bench/ocr_system.py with the interpreter of its own venv (.venv/rapidocr,
made by `make bench`); imports nothing of pipe's.

    .venv/rapidocr/bin/python pipeline/bench/rapidocr_system_peer.py LIST.json   # {"images": [png paths]}

LIST.json may also hold "settings": RapidOCR's own keyword arguments (e.g. {"det_limit_side_len": 960,
"det_limit_type": "max"}), every other setting its default.

Every page once untimed (onnxruntime's first run of a shape), then every page once, timed alone. Prints one
JSON line: {"pages": per page [[4 [x, y]], text, score] for each line it kept, "seconds": per page,
"versions"}. Pages are read by RapidOCR's own loader, as its users feed it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(path: str) -> int:
    import numpy as np
    import onnxruntime
    from rapidocr_onnxruntime import RapidOCR
    from rapidocr_onnxruntime.utils import LoadImage

    doc = json.loads(Path(path).read_text())
    files = doc["images"]
    engine = RapidOCR(**(doc.get("settings") or {}))
    imgs = [LoadImage()(f) for f in files]
    for img in imgs:
        engine(img)
    pages, seconds = [], []
    for img in imgs:
        t0 = time.perf_counter()
        res, _ = engine(img)
        seconds.append(time.perf_counter() - t0)
        pages.append([[np.asarray(box, float).tolist(), text, float(score)] for box, text, score in (res or [])])
    print(json.dumps({"pages": pages, "seconds": seconds,
                      "versions": {"rapidocr_onnxruntime": "1.4.4", "onnxruntime": onnxruntime.__version__,
                                   "numpy": np.__version__}}, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
