"""`make bench` rows for fine-tuning the real PP-OCRv4 recognizer (`pipe train --init <its pipe import>`), issue 33:

    python -m pipeline.bench.ocr_finetune [--quick] bench/OCR_FINETUNE.md    # ~20 min on 2 cores; --quick: 1 process

The pretrained model is imported once (`pipe import pretrained:ch_PP-OCRv4_rec_infer`, no ONNX); then
examples/ppocr_finetune.yaml runs as written (ocr_lines_dotmatrix, 300 lines, batch 16 of which 4 general lines,
finetune's defaults) on 1 process (`pipe train`) and on 2 (`pipe all`: train, export, package, report), one after
the other in this run, each in a fresh process; then the same 1-process run from the same model as PaddleOCR 3.x
ships its models (a PIR inference.json, issue 49: pretrained.paddleocr3_layout of the import), compared with the
legacy program's run step by step. Read from
each run's train manifest: seconds per step and lines per second (the median epoch's: batch_size / img_per_s,
evaluation excluded), and the accuracy before (the pretrained model, measured by the run before its first step)
and after (the best checkpoint the guard chose) on the domain's val split and on the held general lines.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipeline import pretrained

Row = tuple[str, str, str, str]
_REPO = Path(__file__).resolve().parents[2]
EXAMPLE = _REPO / "examples" / "ppocr_finetune.yaml"


def rows(quick: bool = False) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="pipe-bench-ocr-finetune-") as tmp:
        tmp = Path(tmp)
        imp = tmp / "pretrained" / "export"
        _pipe("import", "pretrained:ch_PP-OCRv4_rec_infer", "--task", "ocr_rec", "--out", imp, "--set",
              "import.onnx=false", "--set", "data.ocr_lines=100")
        out: list[Row] = []
        for n in (1,) if quick else (1, 2):
            # 2 processes as the example runs: the whole chain (train, export, package on OpenVINO, report)
            what = ("train",) if n == 1 else ("all",)
            _pipe(*what, "--config", EXAMPLE, "--set", f"model.init={imp}", "--set", f"dist.nproc_per_node={n}",
                  "--run", tmp / f"n{n}")
            out += run_rows(tmp / f"n{n}" / "train")
            if n == 2:
                out += _served_row(tmp / "n2")
        # the PIR route: PP-OCRv4 rec as inference.json + inference.yml, imported, fine-tuned as the n1 run was
        pir_src = pretrained.paddleocr3_layout(imp, tmp / "PP-OCRv4_rec_pir", pretrained.rec_yml(imp / "keys.txt"))
        _pipe("import", pir_src, "--out", tmp / "pir" / "export", "--set", "import.onnx=false", "--set",
              "data.ocr_lines=100")
        _pipe("train", "--config", EXAMPLE, "--set", f"model.init={tmp / 'pir' / 'export'}", "--set",
              "dist.nproc_per_node=1", "--run", tmp / "pir")
        out += pir_rows(tmp / "pir" / "train", tmp / "n1" / "train")
    return out


def pir_rows(pir: Path, legacy: Path) -> list[Row]:
    """The PIR program's fine-tune against the legacy program's, same lines, seed and config: its speed, and its
    per-step losses and final accuracies against the legacy run's (the same ops: equal to the bit when the
    kernels are)."""
    docs = {k: json.loads((Path(d) / "manifest.json").read_text()) for k, d in (("pir", pir), ("legacy", legacy))}
    m = {k: doc["metrics"] for k, doc in docs.items()}
    batch = docs["pir"]["config"]["train"]["batch_size"]
    losses = {}
    for k, d in (("pir", pir), ("legacy", legacy)):
        with open(Path(d) / "steps.csv", newline="") as f:
            losses[k] = [float(r["loss"]) for r in csv.DictReader(f)]
    diff = max((abs(a - b) for a, b in zip(losses["pir"], losses["legacy"])), default=float("inf"))
    same_len = len(losses["pir"]) == len(losses["legacy"]) > 0
    what = f"fine-tune PP-OCRv4 rec from its PIR program (inference.json, 1 process, {m['pir']['steps']} steps)"
    p, g = m["pir"], m["legacy"]
    return [
        (f"{what}: seconds per step, PIR / legacy", f"{batch / p['img_per_s']:.2f} / {batch / g['img_per_s']:.2f}",
         "reported", ""),
        (f"{what}: max |loss diff| over the steps vs the legacy program's run; val_acc, general_acc PIR / legacy",
         f"{diff:.2g}; {p['val_acc']:.4f} / {g['val_acc']:.4f}, {p['general_acc']:.4f} / {g['general_acc']:.4f}",
         "within noise (1e-4)", _status(same_len and diff <= 1e-4)),
    ]


def run_rows(train_dir: Path) -> list[Row]:
    """The rows of one fine-tuning run, from its train manifest."""
    m = json.loads((Path(train_dir) / "manifest.json").read_text())
    got, cfg = m["metrics"], m["config"]
    n, batch = got["world_size"], cfg["train"]["batch_size"]
    what = (f"fine-tune PP-OCRv4 rec ({n} process{'es' if n > 1 else ''}, {cfg['data']['source']} "
            f"{got['samples']['train']} lines, batch {batch}, {got['steps']} steps)")
    drop = got["pretrained_general_acc"] - got["general_acc"]
    bound = cfg["finetune"]["max_drop"]
    return [
        (f"{what}: seconds per step / lines per second", f"{batch / got['img_per_s']:.2f} / {got['img_per_s']:.1f}",
         "reported", ""),
        (f"{what}: domain val_acc before -> after", f"{got['pretrained_val_acc']:.4f} -> {got['val_acc']:.4f}",
         "+0.15 or more", _status(got["val_acc"] - got["pretrained_val_acc"] >= 0.15)),
        (f"{what}: general_acc ({got['general_lines']} {got['general_source']} lines) before -> after",
         f"{got['pretrained_general_acc']:.4f} -> {got['general_acc']:.4f}", f"drop <= {bound:g}",
         _status(drop <= bound + 1e-12)),
    ]


def _served_row(run: Path) -> list[Row]:
    """The exported fine-tuned model as `pipe all` packaged it: its test accuracy against the training's."""
    export = json.loads((run / "export" / "manifest.json").read_text())
    train = json.loads((run / "train" / "manifest.json").read_text())
    package = json.loads((run / "package" / "manifest.json").read_text())
    a, b = export["metrics"]["test_acc"], train["metrics"]["test_acc"]
    engine = package["engine"]
    return [(f"fine-tuned PP-OCRv4 rec through pipe all: exported (an import's artifact, lineage "
             f"{export['source']['kind']}) and packaged ({engine}): test_acc export / train",
             f"{a:.4f} / {b:.4f}", "equal within a line",
             _status(abs(a - b) <= 1 / max(1, train["metrics"]["samples"]["test"]) + 1e-9))]


def _status(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _pipe(*args: Any) -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", *(str(a) for a in args)], capture_output=True,
                          text=True, cwd=_REPO)
    if done.returncode != 0:
        raise RuntimeError(f"pipe {args[0]} failed ({done.returncode}): {done.stderr[-1500:]}")


if __name__ == "__main__":
    from pipeline import bench

    quick = "--quick" in sys.argv
    bench._write(Path(next((a for a in sys.argv[1:] if not a.startswith("--")), "bench/OCR_FINETUNE.md")),
                 rows(quick), quick)
