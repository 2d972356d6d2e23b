"""`pipe predict --ray ADDRESS`: the same job as local predict, its items run by Ray Data actors on a cluster.

    pipe predict runs/ocr_system /shared/scans --out /shared/preds --ray auto
    pipe predict runs/exp1/package scans/ --out preds/ --ray 10.0.0.5:6379 --workers 8 --threads 2

The driver must run on a node of the cluster (`auto`, or HOST:PORT from a node) or be submitted to it (`ray job
submit -- pipe predict ... --ray auto`): Ray Data does not run over Ray Client (`ray://`), which is refused.

The driver (this process) expands the inputs into the same `Item`s as local predict, drops those DIR already
holds, and makes the rest a Ray Dataset (`ray.data.from_items`). `map_batches` runs `_Predict` in a pool of actors
(`--workers`, default: the cluster's CPUs / `--threads`, default 1), each of `num_cpus` = its threads: an actor
takes the package from the object store (the bytes of its files, `ray.put` once), writes it into a temp dir of
its own node, checks the manifest's sha256 and every file's sha256 and size before loading a byte of it, starts the
package's predictor with that many math threads (Ray sets OMP_NUM_THREADS but nothing enforces it), and runs the
package's reference set on its node's CPU (as `pipe serve` does: exit 4 below the budget). Each batch of items is
loaded and answered by local predict's own functions (`run.load_item`, `run.answer_batch`): the same decode,
limits, rows and error rows. Rows stream back (`iter_batches`) and the driver writes them with local predict's
writer (`output.Output`), dropping any row whose item DIR already holds: a batch retried after a lost actor
(Ray restarts actors and retries their tasks) never writes a row twice, and a rerun into DIR resumes.

Inputs are read by the actors: every path must be readable on every node (a shared filesystem, or the same
files at the same paths). Before the job, one task per node checks every source; one it cannot read is refused
naming it and the node (exit 2). pipe must be installed at the same version on every node.

Ray is an optional extra (`pip install 'paddle-pipe[ray]'`); it is imported only here, only with `--ray`.
`ray stop` is never called: a `local` instance is ended by `ray.shutdown()`, and a cluster is left as found.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from pipeline import __version__, artifacts
from pipeline.errors import GateError, InputError, PipeError
from pipeline.predict import inputs as inputs_mod, output, run as run_mod
from pipeline.predict.inputs import Item, Problem

INSTALL = "pip install 'paddle-pipe[ray]'"
_ADDRESS = re.compile(r"^(ray://)?(?P<host>[A-Za-z0-9.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>[0-9]{1,5})$")
_PACKAGES = "pipe-ray-packages"  # beside each node's temp files: one dir per actor process
_local: dict[str, str] = {}  # `--ray local`: the temp dir of the instance this process started


def connect(address: str, cores: int) -> None:
    """Join the cluster at ADDRESS (`local`: a Ray instance in this process on `cores` CPUs; `auto`; HOST:PORT, the
    head's GCS address). InputError for a missing extra, a malformed ADDRESS or Ray Client's `ray://` (Ray Data
    2.60 fails over it: 'Worker' object has no attribute 'core_worker'), PipeError for an address that does not
    answer; nothing is written anywhere."""
    try:
        import ray
        import ray.data  # noqa: F401 (the extra's pyarrow pin is checked here: pyarrow 26 fails beside numpy 1.26)
    except ImportError as e:
        raise InputError(f"--ray: Ray Data does not import here ({str(e).splitlines()[0][:120]}); {INSTALL}") \
            from None
    # Usage stats off in the driver too (`--disable-usage-stats` covers only a cluster); an explicit auth mode,
    # else a token left by an earlier local ray.init() silently turns on token auth (facts §18). A user whose
    # cluster uses tokens sets RAY_AUTH_MODE=token.
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    kw: dict[str, Any] = {"logging_level": "ERROR", "log_to_driver": False, "configure_logging": True}
    if address == "local":  # its own temp dir, removed at the end (Ray never deletes old sessions)
        _local["temp_dir"] = tempfile.mkdtemp(prefix="pipe-ray-")
        kw.update(address="local", num_cpus=cores, include_dashboard=False, _temp_dir=_local["temp_dir"])
    elif address == "auto":
        kw.update(address="auto")
    else:
        m = _ADDRESS.match(address)
        if not m or not 0 < int(m["port"]) < 65536:
            raise InputError(f"--ray {address}: expected local, auto or HOST:PORT (the head's GCS address)")
        if address.startswith("ray://"):  # its executor needs a core worker in the driver (ray-project/ray#48682)
            raise InputError(f"--ray {address}: Ray Data does not run over Ray Client (ray://); run pipe on a node of "
                             "the cluster with --ray auto, or submit it there: ray job submit -- pipe predict ... "
                             "--ray auto")
        _probe(address, m["host"].strip("[]"), int(m["port"]))
        kw.update(address=address)
    try:
        ray.init(**kw)
    except Exception as e:  # ConnectionError, TimeoutError, RuntimeError from Ray's bootstrap: one line
        disconnect()
        raise PipeError(f"--ray {address}: cannot join the Ray cluster ({_first_line(e)})") from None
    ctx = ray.data.DataContext.get_current()
    ctx.wait_for_min_actors_s = 600  # every actor loaded and checked before the first batch: all nodes take work
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    import logging

    logging.getLogger("ray.data").setLevel(logging.ERROR)


def _probe(address: str, host: str, port: int) -> None:
    """A TCP connect first: Ray's own bootstrap retries an address that does not answer for a minute or more."""
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as e:
        raise PipeError(f"--ray {address}: cannot reach the Ray cluster there ({e.strerror or e})") from None


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()  # ends a `local` instance; from a cluster it only detaches this driver
    if "temp_dir" in _local:
        shutil.rmtree(_local.pop("temp_dir"), ignore_errors=True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else e.__class__.__name__)[:300]


def plan(workers: int | None, threads: int | None) -> tuple[int, int, dict[str, float]]:
    """(actors, threads per actor, the cluster's CPUs by node) from the cluster's CPUs: by default one actor per
    CPU of 1 thread; `--threads T`: CPUs // T actors; `--workers W`: W actors. More than the cluster holds would
    wait forever: refused."""
    import ray

    nodes = {n["NodeManagerAddress"]: n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n["Alive"]}
    t = threads if threads is not None else 1
    if not 1 <= t <= 256:
        raise InputError(f"--threads: must be 1..256, got {t}")
    fit = int(sum(math.floor(c / t) for c in nodes.values()))  # an actor's CPUs are on one node
    w = workers if workers is not None else fit
    if not 1 <= w <= 4096:
        raise InputError(f"--workers: must be 1..4096, got {w}" if workers is not None else
                         f"--ray: the cluster has no node with {t} free CPUs ({nodes})")
    if w > fit:
        raise InputError(f"--workers {w} x --threads {t}: the cluster holds {fit} such actors "
                         f"(CPUs by node: {nodes})")
    return w, t, nodes


def todo(items: Iterable[Item | Problem], out: output.Output) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                         run_mod.Counts]:
    """The items as the actors take them (JSON of the item's fields, and for an image file the sha256s DIR holds
    for its path: the actor skips it after hashing if it is one), the error rows of problems found while
    expanding, and the counts of what is already done. Listed twice (a folder and a glob): once."""
    counts = run_mod.Counts()
    held: dict[str, list[str]] = {}
    for key in (*out.done, *out.failed):
        if key[1] is None and key[2] is None:
            held.setdefault(key[0], []).append(key[3])
    seen: set[tuple] = set()
    rows, errors = [], []
    for x in items:
        key = x.key() if isinstance(x, Problem) or x.sha256 is not None else (x.source, None, None, "")
        if key in seen:
            continue
        seen.add(key)
        if (isinstance(x, Problem) or x.sha256 is not None) and (key in out.done or key in out.failed):
            counts.items += 1
            counts.skipped += 1
            counts.previously_failed += key in out.failed
            continue
        if isinstance(x, Problem):
            errors.append({**inputs_mod.describe(x), **({"sha256": x.sha256} if x.sha256 else {}), "error": x.error})
            continue
        doc = {"source": x.source, "kind": x.kind, "page": x.page, "line": x.line, "sha256": x.sha256,
               "text": x.text, "held": held.get(x.source, []) if x.sha256 is None else []}
        rows.append({"item": json.dumps(doc, ensure_ascii=False)})
    return rows, errors, counts


def check_reachable(sources: list[str]) -> None:
    """Every source file readable on every alive node (one task pinned to each; a relative path from this
    process's working directory, as the actors read it), or InputError naming the first that is not and the
    node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ref = ray.put([os.path.join(os.getcwd(), s) for s in sources])
    nodes = [n for n in ray.nodes() if n["Alive"]]
    check = ray.remote(num_cpus=0, max_retries=2)(_unreadable)
    got = ray.get([check.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                   .remote(ref) for n in nodes])
    for n, bad in zip(nodes, got, strict=True):
        if bad:
            raise InputError(f"{sources[bad[0]]}: not readable on the Ray node {n['NodeManagerAddress']} (with --ray every "
                             f"input must be readable on every node: a shared filesystem or the same paths)")


def _unreadable(paths: list[str]) -> list[int]:
    return [i for i, p in enumerate(paths) if not (os.path.isfile(p) and os.access(p, os.R_OK))]


def package_files(package_dir: Path) -> dict[str, bytes]:
    """The package as it travels: manifest.json and every file it lists, by relative path."""
    raw = (package_dir / artifacts.MANIFEST).read_bytes()
    files = {artifacts.MANIFEST: raw}
    for rel in sorted(json.loads(raw)["files"]):
        files[rel] = (package_dir / rel).read_bytes()
    return files


def unpack_verified(files: dict[str, bytes], manifest_sha256: str, dest: Path) -> None:
    """Write the travelled package into `dest`, refusing it (InputError naming the file, nothing written) unless its
    manifest is the driver's (sha256), it holds exactly the manifest's files, and every file's sha256 and size are
    the manifest's."""
    import hashlib

    raw = files.get(artifacts.MANIFEST, b"")
    if hashlib.sha256(raw).hexdigest() != manifest_sha256:
        raise InputError(f"{artifacts.MANIFEST}: not the package the driver verified (sha256 differs)")
    listed = json.loads(raw)["files"]
    if set(files) != {artifacts.MANIFEST, *listed}:
        odd = sorted(set(files) ^ {artifacts.MANIFEST, *listed})[0]
        raise InputError(f"{odd}: the travelled package and its manifest disagree on this file")
    for rel, data in files.items():
        if ".." in Path(rel).parts or Path(rel).is_absolute():
            raise InputError(f"{rel}: a manifest path outside the package")
        if rel != artifacts.MANIFEST and (hashlib.sha256(data).hexdigest() != listed[rel]["sha256"]
                                          or len(data) != listed[rel]["bytes"]):
            raise InputError(f"{rel}: sha256 mismatch in the travelled package")
    for rel, data in files.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


class _Predict:
    """A Ray Data actor: the package verified and loaded once, then batches of items -> rows (module docstring).
    Errors pipe knows (a package that does not verify, a reference set that disagrees, a predictor that does not
    start) become one `fatal` row the driver raises, rather than a Ray traceback."""

    def __init__(self, package: list[Any], manifest_sha256: str, make_model: Callable[[Path, int], Any],
                 threads: int, dpi: float, version: str, cwd: str):
        import ray

        if os.path.isdir(cwd):
            os.chdir(cwd)  # relative INPUT paths read as the driver reads them (this actor serves one job)
        self.node = ray.util.get_node_ip_address()
        self.model = None
        self.fatal: dict[str, Any] | None = None
        self.dir = _own_dir()
        try:
            if version != __version__:
                raise InputError(f"pipe {__version__} on the Ray node {self.node}, {version} on the driver: install "
                                 "the same pipe on every node")
            unpack_verified(ray.get(package[0]), manifest_sha256, self.dir)
            run_mod.few_malloc_arenas()  # this actor's process and the predictors it starts, as local predict's
            self.model = make_model(self.dir, threads)
            self.model.check()  # the reference set on this node's CPU, as pipe serve checks it
        except PipeError as e:
            self.fatal = {"exit": e.exit_code, "error": f"Ray node {self.node}: {e}"}
        self.dpi = dpi

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        import time

        if self.fatal is not None:
            return {"kind": np.array(["fatal"]), "row": np.array([json.dumps(self.fatal)]),
                    "node": np.array([self.node]), "seconds": np.array([0.0])}
        t0 = time.perf_counter()
        kinds, out, loaded = [], [], []
        for raw in batch["item"]:
            doc = json.loads(raw)
            held = set(doc.pop("held"))
            r = run_mod.load_item(self.model, Item(**doc), self.dpi, lambda key: key[3] in held)
            if isinstance(r, tuple):
                kinds.append("skip")
                out.append(json.dumps(list(r[1])))
            elif isinstance(r, Problem):
                kinds.append("error")
                out.append(json.dumps({**inputs_mod.describe(r), **({"sha256": r.sha256} if r.sha256 else {}),
                                       "error": r.error}, ensure_ascii=False))
            else:
                loaded.append(r)
        if loaded:
            rows, errors = run_mod.answer_batch(self.model, 0, loaded)
            for kind, docs in (("row", rows), ("error", errors)):
                kinds += [kind] * len(docs)
                out += [json.dumps(d, ensure_ascii=False) for d in docs]
        n = len(kinds)
        return {"kind": np.array(kinds, dtype=object), "row": np.array(out, dtype=object),
                "node": np.array([self.node] * n, dtype=object), "seconds": np.full(n, time.perf_counter() - t0)}

    def __del__(self) -> None:
        if self.model is not None:
            self.model.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def _own_dir() -> Path:
    """This actor's package dir, `<tmp>/pipe-ray-packages/<pid>-...`; dirs of actor processes that are gone (a
    killed actor leaves its dir) are removed first."""
    root = Path(tempfile.gettempdir()) / _PACKAGES
    root.mkdir(exist_ok=True)
    for old in root.iterdir():
        pid = old.name.split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))


def run(docs: list[dict[str, Any]], out: output.Output, counts: run_mod.Counts, *, package_dir: Path,
        manifest_sha256: str, make_model: Callable[[Path, int], Any], workers: int, threads: int, batch: int,
        dpi: float, progress: Callable[[int], None], on_rows: Callable[[list[dict[str, Any]]], None] | None
        ) -> tuple[dict[str, int], float | None]:
    """The job: `docs` (from `todo`) through a pool of `workers` actors; rows written into `out` as they stream
    back, each item once. Returns the items answered (rows and error rows) by node, and when the first batch
    began on its actor (`time.perf_counter()`; every actor is loaded by then): the job's speed is counted from
    there, as local predict's is counted from its predictors loaded."""
    import time
    import warnings

    import ray
    import ray.data

    by_node: dict[str, int] = {}
    began = None
    if not docs:
        return by_node, began
    # fewer blocks than actors (a small job) only leaves actors idle: Ray Data's warning about it says nothing here
    warnings.filterwarnings("ignore", message="The minimum number of concurrent actors", category=UserWarning)
    ref = ray.put(package_files(package_dir))
    # a block per batch (a lost actor costs one batch), and at least one per actor
    blocks = max(1, min(max(math.ceil(len(docs) / batch), workers), len(docs), 4096))
    ds = ray.data.from_items(docs, override_num_blocks=blocks).map_batches(
        _Predict, batch_size=batch, batch_format="numpy", num_cpus=threads,
        compute=ray.data.ActorPoolStrategy(size=workers),
        fn_constructor_kwargs={"package": [ref], "manifest_sha256": manifest_sha256, "make_model": make_model,
                               "threads": threads, "dpi": dpi, "version": __version__,
                               "cwd": os.getcwd()})
    try:
        for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
            rows, errors, keys = [], [], set()
            for kind, raw, node in zip(b["kind"], b["row"], b["node"], strict=True):
                if kind == "fatal":
                    doc = json.loads(raw)
                    raise {2: InputError, 4: GateError}.get(doc["exit"], PipeError)(doc["error"])
                if kind == "skip":
                    key = tuple(json.loads(raw))
                    counts.items += 1
                    counts.skipped += 1
                    counts.previously_failed += key in out.failed
                    progress(1)
                    continue
                row = json.loads(raw)
                key = output.row_key(row)
                if key in out.done or key in out.failed or key in keys:
                    continue  # a retried batch's row, already written
                keys.add(key)
                (rows if kind == "row" else errors).append(row)
                by_node[node] = by_node.get(node, 0) + 1
            if began is None and len(b["seconds"]):
                began = time.perf_counter() - float(b["seconds"].max())
            if rows or errors:
                out.write(rows, errors)
                counts.items += len(rows) + len(errors)
                counts.done += len(rows)
                counts.failed += len(errors)
                if on_rows is not None and rows:
                    on_rows(rows)
                progress(len(rows) + len(errors))
    except ray.exceptions.RayError as e:
        raise PipeError(f"the Ray job failed ({_first_line(e)}); the Ray logs on the nodes say more") from None
    print(f"pipe predict: ray: {workers} actor(s) x {threads} thread(s); items by node: "
          + ", ".join(f"{n} {c}" for n, c in sorted(by_node.items())), file=sys.stderr, flush=True)
    return by_node, began
