"""`make bench` rows for ernie_tiny (two int64 inputs: input_ids, token_type_ids) on the Chinese sentiment task.

    python -c "from pipeline.bench import ernie; [print(r) for r in ernie.rows(quick=True)]"

One run of the real stages in subprocesses, as a user would: `pipe train --config
examples/chinese_sentiment_ernie.yaml` (its model and hyperparameters; quick: 1 epoch), `pipe export`,
`pipe compress --int8 --backend both` with compress's own gates (three times on the same export unless
quick, as the other text models in `pipeline/bench/compress.py`), `pipe package --engine auto` of the
first compress run, and that package served with text requests at 16 clients
(`pipeline/bench/serving.py`). The rows: test accuracy and training samples/s from the train manifest,
the compress table of every engine against Paddle fp32, the auto pick (checked against the real package),
fp32 vs int8 accuracy on the test texts, and the served rows. The text_fasttext and text_cnn rows of
the same tables sit beside these in the same run (compress.text_rows, serving.text_rows).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

from pipeline.bench import compress as bc, serving
from pipeline.errors import PipeError

Row = tuple[str, str, str, str]

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "chinese_sentiment_ernie.yaml"


def rows(quick: bool) -> list[Row]:
    timing, repeats = (bc.QUICK_TIMING, 1) if quick else ((), bc.REPEATS)
    tmp = Path(tempfile.mkdtemp(prefix="pipe-bench-ernie-"))
    run = tmp / "ernie"
    epochs = ["--epochs", "1"] if quick else []
    name = f"ernie_tiny chinese_sentiment (`{_EXAMPLE.relative_to(_EXAMPLE.parents[1])}`{', 1 epoch' if quick else ''})"
    try:
        t0 = time.perf_counter()
        bc.pipe("train", "--config", str(_EXAMPLE), "--run", str(run), *epochs, cwd=tmp)
        train_s = time.perf_counter() - t0
        bc.pipe("export", str(run / "train"), cwd=tmp)
        runs = [bc.compress_run(run, "both", timing, i, gated=True) for i in range(repeats)]
        package = tmp / "package"
        bc.pipe("package", str(run / "compress-both-0"), "--engine", "auto", "--no-triton", "--out", str(package),
                cwd=tmp)
        wall = time.perf_counter() - t0
        shipped = json.loads((package / "manifest.json").read_text())["metrics"].get("variant", "")
        out = _train_rows(name, run, train_s)
        out += bc.speed_rows(f"compress {name}", runs, {}, "test texts")
        out.append(bc.pick_row(f"compress {name}", runs, packaged=shipped))
        out += bc.text_accuracy_rows(f"compress {name}", run)
        out.append((f"{name}: wall time of train + export + {len(runs)} x compress + package", bc.wall_time(wall),
                    "", ""))
        return out + serving.served_text_rows("ernie_tiny text", package, quick)
    except PipeError as e:
        return [(f"{name}", f"failed: {str(e)[-300:]}", "train, export, compress, package, serve", "**failed**")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _train_rows(name: str, run: Path, seconds: float) -> list[Row]:
    from safetensors.numpy import load_file

    m = json.loads((run / "train" / "manifest.json").read_text())
    metrics, cfg = m["metrics"], m["config"]["train"]
    params = sum(a.size for a in load_file(run / "train" / "model.safetensors").values())
    what = f"{cfg['epochs']} epochs, batch {cfg['batch_size']}, {cfg['optimizer']} lr {cfg['lr']:g}"
    return [
        (f"train {name}: test accuracy ({what}; {params / 1e3:.0f}k parameters from random weights)",
         f"{metrics['test_acc']:.2%} (val {metrics['val_acc']:.2%}; {metrics['samples']['test']} test texts)",
         "reported", ""),
        (f"train {name}: training samples/s (median over epochs, 1 process) and wall time of `pipe train`",
         f"{metrics['img_per_s']:.0f} samples/s; {seconds:.0f} s", "reported", ""),
    ]
