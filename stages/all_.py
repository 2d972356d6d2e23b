"""`pipe all`: every stage in order into one run directory, each reading the previous one's artifact.

    pipe all --config examples/digits.yaml --run runs/digits
    pipe all --config examples/digits.yaml --run runs/digits --force compress

train -> export -> compress (when `compress.int8` or `compress.distill`) -> package -> `report.md` and a
self-contained `report.html` in RUN (pipeline/report.py). With `import.source` set, `pipe import` of that
model writes RUN/export in place of train and export (its cache key: the import and data sections and the
source's and key file's fingerprints; `--force import` reruns it).

Cache: `RUN/pipeline.json` records, per stage, a key (the stage's config sections, its input's manifest
sha256 — for train the data's and model's content fingerprint — and pipe's and the libraries' versions)
and the sha256 of the manifest it produced. A stage whose key is unchanged and whose artifact still
verifies with that manifest is skipped ("cached"); `--force STAGE` reruns that stage and every later one.
A cached artifact that no longer verifies is not rebuilt silently: that is the artifact gate (exit 6).

Release gates, each with its own exit code (see pipeline/errors.py): training diverged 3, int8 accuracy
drop over `compress.max_drop` 4 (and `release.min_accuracy` on the packaged model), export/ONNX parity
5, a missing or unverifiable artifact 6.

What gets packaged (`release.pick`, `release.engine`, `release.optimize`): among the variants on every
engine (Paddle Inference, onnxruntime, OpenVINO) that compress measured within `compress.max_drop` points
of the reference accuracy and marked shippable (agreement >= `compress.min_agreement`, not unreliable on
this CPU), the fastest by `release.optimize`, the smallest, or fp32: the rule of `pipe package --engine
auto` (`pipeline/choose.py`). Said with the numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline import artifacts, job
from pipeline.config import RunConfig
from pipeline.errors import ArtifactError, GateError, InputError, Int8GateError

STAGES = ("train", "export", "compress", "package")
RECORD = "pipeline.json"


@dataclass
class StageResult:
    stage: str
    path: Path
    status: str  # "ran" or "cached"
    seconds: float
    note: str = ""


@dataclass
class Choice:
    model_dir: Path
    variant: str
    precision: str
    why: str
    accuracy: float | None
    engine: str = "paddle_inference"


def run_all(cfg: RunConfig, run_dir: Path, resume: str | None = None, force: str | None = None,
            say: Callable[[str], None] = print,
            on_stage: Callable[[StageResult], None] = lambda r: None) -> list[StageResult]:
    """Run (or reuse) every stage; returns what happened to each. Raises the failing gate's error.
    The run directory is locked for the whole chain: a second `pipe all` or `pipe train` on it exits 2."""
    if force is not None and force not in (*STAGES, "import"):
        raise InputError(f"--force: must be one of {', '.join(STAGES)} or import, got {force!r}")
    if cfg.system.det or cfg.system.cls or cfg.system.rec:
        return _run_system(cfg, Path(run_dir), resume, force, say, on_stage)
    with job.run_lock(Path(run_dir), "pipe all", job.lock_name(cfg.dist.nnodes, cfg.dist.node_rank)):
        return _run_all(cfg, Path(run_dir), resume, force, say, on_stage)


def _run_system(cfg: RunConfig, run_dir: Path, resume: str | None, force: str | None,
                say: Callable[[str], None], on_stage: Callable[[StageResult], None]) -> list[StageResult]:
    """`system:` set: each part's config (`system.det`, `.cls`, `.rec`) run as its own chain in RUN/<role> (cached,
    reported and gated as any run), then its three packages composed into RUN/ocr_system
    (`pipeline/ocr_system/package.py`), reused while the parts' packages and drop_score are the same."""
    from pipeline import config as config_mod
    from pipeline.ocr_system import package as ocr_package
    from stages import package

    if resume:
        raise InputError("--resume: an OCR system's parts are imports, nothing of them trains")
    parts = {role: getattr(cfg.system, role) for role in ("det", "cls", "rec") if getattr(cfg.system, role)}
    if "det" not in parts or "rec" not in parts:
        raise InputError(f"system: an OCR system needs system.det and system.rec (configs of an ocr_det and an ocr_rec "
                         f"import); got {', '.join(f'system.{r}' for r in parts)}")
    configs = {role: config_mod.load(Path(path)) for role, path in parts.items()}  # every config read first
    results: list[StageResult] = []
    with job.run_lock(run_dir, "pipe all", job.lock_name(cfg.dist.nnodes, cfg.dist.node_rank)):
        for role, part in configs.items():
            say(f"system.{role}: {parts[role]} -> {run_dir / role}")
            results += _run_part(role, part, run_dir / role, force, say, on_stage)
        packages = [run_dir / role / "package" for role in configs]
        out = run_dir / ocr_package.STAGE
        same = _same_system(out, packages, cfg.system.drop_score)
        if same and force is None:
            say(f"{ocr_package.STAGE}: cached (the same parts' packages and drop_score; verified) -> {out}")
            results.append(StageResult(ocr_package.STAGE, out, "cached", 0.0, "same packages"))
        else:
            say(f"{ocr_package.STAGE} ...")
            t0 = time.perf_counter()
            ocr_package.compose(package.PackageConfig(), packages, out, package.run, cfg.system.drop_score)
            results.append(StageResult(ocr_package.STAGE, out, "ran", time.perf_counter() - t0))
        on_stage(results[-1])
        say(f"{ocr_package.STAGE}: {ocr_package.describe(ocr_package.load(out))}")
        _predict_step(cfg, out, run_dir, say, results)
    return results


def _run_part(role: str, part: RunConfig, part_dir: Path, force: str | None, say: Callable[[str], None],
              on_stage: Callable[[StageResult], None]) -> list[StageResult]:
    """One part's chain in RUN/<role>. A part whose int8 misses its budget (compress's int8 gate, exit 4 alone)
    ships fp32 in the system, said in one line: the system is still built, every other part as configured."""
    def tag(r: StageResult) -> StageResult:
        return dataclasses.replace(r, stage=f"{role} {r.stage}")

    try:
        ran = run_all(part, part_dir, None, force, say, lambda r: on_stage(tag(r)))
    except Int8GateError as e:
        if not part.compress.int8 or part.compress.distill:
            raise
        say(f"system.{role}: ships fp32: no int8 within compress.max_drop {part.compress.max_drop:g} "
            f"({str(e).splitlines()[0]})")
        fp32 = dataclasses.replace(part, compress=dataclasses.replace(part.compress, int8=False))
        ran = run_all(fp32, part_dir, None, force, say, lambda r: on_stage(tag(r)))
    return [tag(r) for r in ran]


def _same_system(out: Path, packages: list[Path], drop_score: float) -> bool:
    """Whether `out` is a verified system of exactly these packages (by their manifests) and drop_score."""
    from pipeline.ocr_system import package as ocr_package

    if not out.exists():
        return False
    try:
        m = artifacts.verify(out, (ocr_package.STAGE,)).manifest
    except InputError:
        return False
    want = {ocr_package.role_of(p): artifacts.verify(p, ("package",)).manifest_sha256 for p in packages}
    got = {role: part.get("manifest_sha256") for role, part in (m.get("parts") or {}).items()}
    return got == want and m["config"].get("drop_score") == drop_score


def _run_all(cfg: RunConfig, run_dir: Path, resume: str | None, force: str | None,
             say: Callable[[str], None], on_stage: Callable[[StageResult], None]) -> list[StageResult]:
    from stages import compress, export, import_, package, train

    imported = bool(cfg.import_.source)
    if imported and (resume or cfg.model.init):
        raise InputError(f"import.source {cfg.import_.source}: pipe all imports that model in place of train and "
                         f"export; --resume and model.init are training's")
    force = "export" if force == "import" else force  # an import chain's export stage is the import
    cache = _Cache(run_dir, STAGES.index(force) if force else len(STAGES), say)
    if resume:
        cache.resume = True  # --resume asks for training; later stages rerun only if train/ changed
    stages = [s for s in STAGES if (s != "compress" or cfg.compress.int8 or cfg.compress.distill)
              and not (imported and s == "train")]
    results: list[StageResult] = []

    def step(name: str, key_doc: dict[str, Any], build: Callable[[], Path]) -> Path:
        n = stages.index(name) + 1
        path = run_dir / name
        key = _key(name, key_doc)
        hit = cache.lookup(name, path, key)
        if hit is not None:
            say(f"[{n}/{len(stages)}] {name}: cached ({hit}) -> {path}")
            results.append(StageResult(name, path, "cached", 0.0, hit))
            on_stage(results[-1])
            return path
        say(f"[{n}/{len(stages)}] {name}{' (pipe import ' + cfg.import_.source + ')' if imported and name == 'export' else ''} ...")
        t0 = time.perf_counter()
        build()
        seconds = time.perf_counter() - t0
        cache.store(name, path, key, seconds)
        results.append(StageResult(name, path, "ran", seconds))
        on_stage(results[-1])
        return path

    if imported:  # someone else's exported model, measured and parity-checked, as this run's export/
        src = Path(cfg.import_.source)
        inputs = {"source": _fingerprint(str(src)), "data": _fingerprint(cfg.data.source)}
        if cfg.import_.keys:
            inputs["keys"] = _fingerprint(cfg.import_.keys)
        export_dir = step("export", {"config": _sections(cfg, "import", "data", "postprocess"), "inputs": inputs},
                          lambda: import_.run(cfg, src, run_dir / "export"))
    else:
        train_sections = ("data", "model", "train", "amp", "dist", "distill", "finetune")
        train_dir = step("train", {"config": _sections(cfg, *train_sections),
                                   "inputs": _fingerprints(cfg)},
                         lambda: train.run(cfg, run_dir / "train", resume=resume))
        export_dir = step("export", {"config": _sections(cfg, "export"), "input": _manifest_sha(train_dir)},
                          lambda: export.run(cfg, train_dir, run_dir / "export"))
    compress_dir = None
    if "compress" in stages:
        extra = ("distill", "train", "amp", "dist") if cfg.compress.distill else ()
        compress_dir = step("compress", {"config": _sections(cfg, "compress", *extra),
                                         "input": _manifest_sha(export_dir)},
                            lambda: compress.run(cfg, export_dir, run_dir / "compress"))
    choice = choose(cfg, export_dir, compress_dir)
    say(f"package: {choice.variant or 'export fp32'} on {choice.engine} ({choice.why})")
    pcfg = package.PackageConfig(precision=choice.precision, variant=choice.variant,
                                 engine=cfg.release.engine if compress_dir is None else "auto")
    step("package", {"config": dataclasses.asdict(pcfg), "variant": choice.variant,
                     "input": _manifest_sha(choice.model_dir)},
         lambda: package.run(pcfg, choice.model_dir, run_dir / "package"))
    if choice.engine == "auto":  # an export: pipe package measured its engines and says what it shipped
        shipped = _read(run_dir / "package")
        choice = dataclasses.replace(choice, engine=shipped["engine"], why=f"{choice.why}; {shipped['chosen']['why']}")
    cache.record["packaged"] = {"variant": choice.variant, "engine": choice.engine, "precision": choice.precision,
                                "why": choice.why,
                                "from": os.path.relpath(choice.model_dir, run_dir)}
    cache.save()
    verify_release(run_dir, cache)
    from pipeline import report

    md, html = report.write(run_dir)
    say(f"report: {md} and {html}")
    _accuracy_gate(cfg, choice, _task(export_dir))
    _predict_step(cfg, run_dir / "package", run_dir, say, results)
    return results


def _predict_step(cfg: RunConfig, package_dir: Path, run_dir: Path, say: Callable[[str], None],
                  results: list[StageResult]) -> None:
    """`predict.inputs` set: `pipe predict` of the released package over them into RUN/predict (resumed when it
    holds this package's rows; started afresh when they are an older package's). Items that fail are said and
    noted, not a failed run: the release itself passed its gates."""
    import shutil

    if not cfg.predict.inputs:
        return
    from pipeline.predict import output
    from stages import predict

    out = run_dir / "predict"
    mine = artifacts.verify(package_dir, ("package", "ocr_system")).manifest_sha256
    old = out / output.FINGERPRINT
    if old.exists() and json.loads(old.read_text(encoding="utf-8")).get("package_sha256") != mine:
        say(f"predict: {out} holds an older package's rows; starting afresh")
        shutil.rmtree(out)
    say(f"predict: {package_dir} over {cfg.predict.inputs} ...")
    t0 = time.perf_counter()
    p = cfg.predict
    s = predict.run(predict.PredictConfig(dpi=p.dpi, field=p.field, draw=p.draw), package_dir, [p.inputs], out)
    bad = s["failed"] + s["previously_failed"]
    note = f"{s['done']} done, {s['skipped']} already there, {bad} failed"
    if bad:
        say(f"predict: warning: {bad} of {s['items']} items failed; see {s['errors']}")
    results.append(StageResult("predict", out, "ran", time.perf_counter() - t0, note))  # said: no manifest to show


def _task(export_dir: Path) -> Any:
    """The export's task, as its interface records it (an imported model's comes from import, not model.task)."""
    from pipeline import iospec, tasks

    iface = _read(export_dir)["interface"]
    return tasks.from_interface(iface, iospec.IO.from_interface(iface))[0]


def choose(cfg: RunConfig, export_dir: Path, compress_dir: Path | None) -> Choice:
    """The variant and engine to package, by `release.pick` / `release.engine` / `release.optimize`, from what
    compress measured on this machine: the rule of `pipe package --engine auto` (`pipeline/choose.py`)."""
    from pipeline import choose as choose_mod, engines

    task = _task(export_dir)
    if compress_dir is None:  # release.engine names an engine, else pipe package measures the export's fp32 ones
        acc = _read(export_dir).get("metrics", {}).get(f"test_{task.monitor}")
        engine = "auto" if cfg.release.engine == "auto" else engines.resolve(cfg.release.engine, "release.engine")
        why = "no compress stage configured (compress.int8/distill off)" + (
            f"; release.engine {cfg.release.engine}" if cfg.release.engine != "auto" else
            "; pipe package measures the export's fp32 engines")
        return Choice(export_dir, "", "fp32", why, acc, engine)
    from pipeline import fidelity

    comp = _read(compress_dir)
    metrics = comp["metrics"]
    variants = fidelity.verdicts(metrics, (comp.get("config") or {}).get("compress"), task.maximize)
    ref, ref_name = (variants.get("fp32") or {}).get("accuracy"), "fp32"
    if "distill" in metrics:  # the variants are the student's; the budget is against the teacher
        ref, ref_name = metrics["distill"]["teacher_test_acc"], f"teacher {metrics['distill']['teacher_model']}"
    engine = "" if cfg.release.engine == "auto" else engines.resolve(cfg.release.engine, "release.engine")
    try:
        got = choose_mod.pick(variants, ref_accuracy=ref, ref_name=ref_name, max_drop=cfg.compress.max_drop,
                              optimize=cfg.release.optimize, rule=cfg.release.pick, engine=engine,
                              where="release gate", maximize=task.maximize)
    except GateError as e:
        if "distill" not in metrics:
            raise
        acc = _read(export_dir).get("metrics", {}).get(f"test_{task.monitor}")
        return Choice(export_dir, "", "fp32", f"no student variant within {cfg.compress.max_drop:.2f} points of the "
                      f"{ref_name} ({str(e).split(' (', 1)[-1].rstrip(')')}): the teacher's fp32 export", acc, "auto")
    why = got.why
    if "distill" in metrics:
        why = f"distilled student {metrics['distill']['student']}: " + why
    return Choice(compress_dir, got.variant, got.precision, why, got.accuracy, got.engine)


def verify_release(run_dir: Path, cache: "_Cache | None" = None) -> None:
    """The artifact gate: the package and its whole lineage verify, and match what this run recorded."""
    try:
        pkg = artifacts.verify(run_dir / "package", ("package",))
    except InputError as e:
        raise ArtifactError(f"artifact gate: {e}") from None
    for item, note in artifacts.lineage(pkg, check=True):
        if item is None or note:
            where = "" if item is None else f"{item.path}: "
            raise ArtifactError(f"artifact gate: {where}{note}")
    if cache is not None:
        for name, rec in cache.record["stages"].items():
            path = run_dir / name
            if path.exists() and _manifest_sha(path) != rec["manifest_sha256"]:
                raise ArtifactError(f"artifact gate: {path / artifacts.MANIFEST}: changed after pipe all wrote it")


def _accuracy_gate(cfg: RunConfig, choice: Choice, task: Any) -> None:
    want = cfg.release.min_accuracy
    if want > 0 and task.monitor != "acc":
        metric = choice.accuracy
        if metric is None or (metric < want if task.maximize else metric > want):
            got = "unmeasured" if metric is None else f"{metric:.4f}"
            bound = "at least" if task.maximize else "at most"
            raise GateError(f"release gate: packaged {choice.variant} test {task.monitor} {got}, release.min_accuracy "
                            f"wants {bound} {want:g} (task {task.name}'s monitored metric)")
        return
    if want > 0 and (choice.accuracy is None or choice.accuracy < want):
        got = "unmeasured" if choice.accuracy is None else f"{choice.accuracy:.2%}"
        raise GateError(f"release gate: packaged {choice.variant} test accuracy {got} < release.min_accuracy "
                        f"{want:.2%}")


class _Cache:
    def __init__(self, run_dir: Path, rerun_from: int, say: Callable[[str], None]):
        self.path, self.rerun_from, self.say = run_dir / RECORD, rerun_from, say
        self.resume = False
        self.record: dict[str, Any] = {"schema": 1, "stages": {}}
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(doc, dict) and doc.get("schema") == 1 and isinstance(doc.get("stages"), dict):
                self.record = doc
        except (OSError, ValueError):
            pass  # no record (first run) or an unreadable one: nothing is cached

    def lookup(self, name: str, path: Path, key: str) -> str | None:
        """A reason the stage is reused, or None to run it (saying why when that is not obvious)."""
        rec = self.record["stages"].get(name)
        if STAGES.index(name) >= self.rerun_from or (name == "train" and self.resume):
            if rec is not None:
                self.say(f"{name}: forced ({'--force' if STAGES.index(name) >= self.rerun_from else '--resume'})"
                         " - rerunning")
            return None
        if not isinstance(rec, dict) or rec.get("key") != key:
            if isinstance(rec, dict):
                self.say(f"{name}: config, input or versions changed since the last run - rerunning")
            return None
        if not path.exists():
            self.say(f"{name}: {path} is missing - rerunning")
            return None
        try:
            art = artifacts.verify(path, (name,))
        except InputError as e:
            raise ArtifactError(f"artifact gate: {e} (pipe all --force {name} rebuilds it)") from None
        if art.manifest_sha256 != rec.get("manifest_sha256"):
            self.say(f"{name}: {path} was rewritten outside pipe all - rerunning")
            return None
        return "same config, input and versions; verified"

    def store(self, name: str, path: Path, key: str, seconds: float) -> None:
        # A rerun stage invalidates every later one: their input changed. Unless it did not: a rerun that left
        # its artifact as it was (`pipe train --resume auto` on a finished run) keeps the later ones cached.
        sha = _manifest_sha(path)
        if (self.record["stages"].get(name) or {}).get("manifest_sha256") != sha:
            later = STAGES[STAGES.index(name) + 1:]
            self.record["stages"] = {k: v for k, v in self.record["stages"].items() if k not in later}
            self.rerun_from = min(self.rerun_from, STAGES.index(name) + 1)
        self.record["stages"][name] = {"key": key, "manifest_sha256": sha, "seconds": round(seconds, 2)}
        self.save()

    def save(self) -> None:
        artifacts.write_text_atomic(self.path, json.dumps(self.record, indent=2) + "\n")


def _key(stage: str, doc: dict[str, Any]) -> str:
    blob = json.dumps({"stage": stage, "doc": doc, "versions": artifacts.versions()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def _sections(cfg: RunConfig, *names: str) -> dict[str, Any]:
    d = cfg.to_dict()
    return {n: d[n] for n in names}


def _read(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / artifacts.MANIFEST).read_text(encoding="utf-8"))


def _manifest_sha(path: Path) -> str:
    try:
        return hashlib.sha256((Path(path) / artifacts.MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return ""


def _fingerprints(cfg: RunConfig) -> dict[str, str]:
    """What training reads besides its config: data files, a module:factory's source, a teacher."""
    out = {"data": _fingerprint(cfg.data.source), "model": _fingerprint(cfg.model.name)}
    src = Path(cfg.data.source)
    for f in dataclasses.fields(cfg.data):  # data.coco_* outside data.source are not in its fingerprint
        value = getattr(cfg.data, f.name)
        if f.name.startswith("coco_") and value and not (src / value).resolve().is_relative_to(src.resolve()):
            out[f"data.{f.name}"] = _fingerprint(str(src / value))
    if cfg.distill.teacher:
        out["teacher"] = _manifest_sha(Path(cfg.distill.teacher))
    if cfg.model.init:  # the starting weights: a file's bytes, or a train artifact's manifest
        init = Path(cfg.model.init)
        out["init"] = _manifest_sha(init) if init.is_dir() else _fingerprint(cfg.model.init)
    return out


def _fingerprint(source: str) -> str:
    p = Path(source)
    if p.is_file():
        return "file:" + artifacts.sha256_file(p)
    if "," in source and not p.exists():  # label files comma-separated (PaddleOCR's label_file_list): each one's
        return "files:" + hashlib.sha256("\n".join(_fingerprint(s.strip()) for s in source.split(",")).encode()).hexdigest()
    if p.is_dir():  # an ImageFolder: names, sizes and mtimes (hashing every image would cost a full read)
        h = hashlib.sha256()
        for dirpath, dirs, names in os.walk(p):
            dirs.sort()
            for n in sorted(names):
                st = (Path(dirpath) / n).stat()
                h.update(f"{os.path.relpath(Path(dirpath) / n, p)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        return "dir:" + h.hexdigest()
    if ":" in source:  # module:factory: the module's source file, found from the cwd as models.py does
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            spec = importlib.util.find_spec(source.partition(":")[0])
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin and Path(spec.origin).is_file():
            return "module:" + artifacts.sha256_file(Path(spec.origin))
    return "name:" + source  # built-in: versioned with pipe itself
