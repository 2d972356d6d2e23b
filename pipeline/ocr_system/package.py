"""The OCR system as one package: `pipe package DET [CLS] REC` composes a text detector (ocr_det), an optional
text-line orientation classifier (ocr_cls) and a recognizer (ocr_rec) into one directory that `pipe serve` runs as
one server answering `/v1/ocr` (`pipeline/ocr_system/serving.py`).

    runs/ocr/
      det/  cls/  rec/     each a whole package (`pipe package`: its own manifest, engine, reference set, README)
      system.yaml          which folder plays which part, drop_score, and what the system measured end to end
      README.md            how to call it
      manifest.json        sha256 of every file above, the packages' own manifests included

Each input is a package (copied whole) or an export/compress artifact (`pipe package` runs on it first, with
the command's flags: each model on the engine measured fastest for it). Its role is its task, read from its
manifest; the order of the inputs does not matter. Before the directory is committed the system runs whole,
in-process, on each package's own engine, on the detector's test pages (the built-in generated pages, or the
user's own detection label file): the detection's hmean and the share of lines read exactly
(`ocr_system.end_to_end`) go into the manifest's metrics, system.yaml and the README.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from pipeline import artifacts, ocr_system
from pipeline.errors import InputError

STAGE = "ocr_system"
SYSTEM_FILE = "system.yaml"
SCHEMA = 1
ROLES = {"ocr_det": "det", "ocr_cls": "cls", "ocr_rec": "rec"}  # task -> the folder it goes in
MEASURE_PAGES = 8  # test pages the system reads before it is committed (each ~1 s on 2 cores)


@dataclass(frozen=True)
class SystemSpec:
    """A verified system package: its folder, system.yaml, each part's loaded package by role."""

    dir: Path
    doc: dict[str, Any]
    parts: dict[str, Any]  # role -> pipeline.serving.spec.Spec
    manifest_sha256: str
    variants: dict[str, str] = dataclasses.field(default_factory=dict)  # role -> the part's packaged variant

    @property
    def drop_score(self) -> float:
        return float(self.doc["drop_score"])


def role_of(path: Path) -> str:
    """The role (det, cls, rec) of an export, compress or package artifact, from its task; one line otherwise."""
    art = artifacts.verify(path, ("export", "compress", "package"))
    task = str(((art.manifest.get("interface") or {}).get("task") or {}).get("spec") or "classification")
    if task not in ROLES:
        raise InputError(f"{path}: a {task} model; an OCR system is made of ocr_det, ocr_cls and ocr_rec models "
                         "(one of each, cls optional)")
    return ROLES[task]


def compose(cfg: Any, dirs: list[Path], out_dir: Path, package: Callable[[Any, Path, Path], Any],
            drop_score: float = ocr_system.DROP_SCORE) -> Path:
    """`pipe package DET [CLS] REC --out OUT`: each part packaged by `package(cfg, src, dest)` (the package
    stage's `run`; or copied, if a package already) into OUT/<role>, the system measured end to end, OUT
    committed whole or not at all."""
    from pipeline.serving import spec as spec_mod

    if not 0.0 <= drop_score <= 1.0:
        raise InputError(f"--drop-score: must be 0..1, got {drop_score:g}")
    by_role: dict[str, Path] = {}
    for d in dirs:
        role = role_of(Path(d))
        if role in by_role:
            raise InputError(f"{d}: a second {role} model (the first: {by_role[role]}); an OCR system takes one of each")
        by_role[role] = Path(d)
    missing = [r for r in ("det", "rec") if r not in by_role]
    if missing:
        raise InputError(f"an OCR system needs a text detector (ocr_det) and a recognizer (ocr_rec); no {missing[0]} "
                         f"among {', '.join(str(d) for d in dirs)}")
    doc = {"package": dataclasses.asdict(cfg), "drop_score": drop_score,
           "parts": {role: str(d) for role, d in by_role.items()}}
    with artifacts.write_stage(out_dir, STAGE, doc) as w:
        parts = {}
        for role, src in sorted(by_role.items(), key=lambda kv: ("det", "cls", "rec").index(kv[0])):
            dest = w.dir / role
            if artifacts.verify(src, ("export", "compress", "package")).stage == "package":
                shutil.copytree(src, dest)
            else:
                print(f"package: {role}: {src}")
                part_cfg = cfg if cfg.name == "" else dataclasses.replace(cfg, name=f"{cfg.name}-{role}")
                package(part_cfg, src, dest)
            parts[role] = spec_mod.load_package(dest)
        names = [p.name for p in parts.values()]
        if len(set(names)) < len(names):
            raise InputError(f"{', '.join(str(d) for d in dirs)}: two parts have the same model name "
                             f"{next(n for n in names if names.count(n) > 1)!r}; package one with --name")
        measured = measure(parts, drop_score)
        system = {"schema": SCHEMA, "system": "ocr", "parts": {role: role for role in parts},
                  "drop_score": drop_score, "measured": measured}
        (w.dir / SYSTEM_FILE).write_text(yaml.safe_dump(system, sort_keys=False), encoding="utf-8")
        variants = {role: _variant(p) for role, p in parts.items()}
        (w.dir / "README.md").write_text(_readme(parts, variants, system), encoding="utf-8")
        w.metrics = {**{k: v for k, v in measured.items() if k != "on"},
                     **{f"{role}_engine": p.engine for role, p in parts.items()},
                     **{f"{role}_variant": variants[role] for role in parts}}  # not _precision: det_precision is det's
        w.extra = {"system": "ocr", "parts": {role: {"name": p.name, "engine": p.engine, "precision": p.precision,
                                                     "variant": variants[role], "manifest_sha256": p.manifest_sha256}
                                              for role, p in parts.items()}}
    return Path(out_dir)


def load(path: Path) -> SystemSpec:
    """Verify a system package (every file's sha256, system.yaml, each part a valid package) and read it."""
    from pipeline.serving import spec as spec_mod

    path = Path(path)
    art = artifacts.verify(path, (STAGE,))
    where = path / SYSTEM_FILE
    try:
        doc = yaml.safe_load(where.read_text(encoding="utf-8"))
        ok = (doc["schema"] == SCHEMA and doc["system"] == "ocr" and isinstance(doc["parts"], dict)
              and set(doc["parts"]) <= set(ROLES.values()) and {"det", "rec"} <= set(doc["parts"])
              and all(doc["parts"][r] == r for r in doc["parts"])
              and isinstance(doc["drop_score"], (int, float)) and 0 <= doc["drop_score"] <= 1)
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        ok = False
    if not ok:
        raise InputError(f"{where}: not an OCR system spec this pipe reads (schema {SCHEMA})")
    allowed = {SYSTEM_FILE, "README.md", artifacts.MANIFEST}
    odd = sorted(f for f in art.manifest["files"] if f not in allowed and f.split("/", 1)[0] not in doc["parts"])
    if odd:
        raise InputError(f"{path / artifacts.MANIFEST}: {odd[0]} is not part of an OCR system package")
    parts = {role: spec_mod.load_package(path / role) for role in doc["parts"]}
    want = {"det": "ocr_det", "cls": "ocr_cls", "rec": "ocr_rec"}
    for role, p in parts.items():
        if p.task.name != want[role]:
            raise InputError(f"{path / role / 'serving.yaml'}: a {p.task.name} package in the {role} folder "
                             f"(needs {want[role]})")
    recorded = art.manifest.get("parts") or {}  # a system composed before variants were recorded: ''
    variants = {role: str((recorded.get(role) or {}).get("variant") or "") for role in parts}
    return SystemSpec(path, doc, parts, art.manifest_sha256, variants)


def describe(system: SystemSpec) -> str:
    """Each part's precision, variant and engine in one line, e.g. `det int8 (openvino-int8 on openvino), ...`."""
    return ", ".join(f"{role} {p.precision} ({system.variants.get(role) or '?'} on {p.engine})"
                     for role, p in system.parts.items())


def measure(parts: dict[str, Any], drop_score: float) -> dict[str, Any]:
    """The system read whole, in-process, each part on its package's engine, over the detector's test pages
    (at most MEASURE_PAGES): the detection's hmean/precision/recall and the share of lines read exactly
    (`ocr_system.end_to_end`, with the recognizer's ignore_space and nfkc), the pages and lines it read, and
    seconds per page."""
    from pipeline import config as config_mod, runtime
    from pipeline.tasks import ocr_det

    det = parts["det"]
    threads = runtime.threads_per_process(1)
    runtime.import_paddle(threads)
    config = _config_of(det)
    data = ocr_det.load_data(config_mod.from_dict(config).data, det.info)
    test = data.test
    n = min(MEASURE_PAGES, len(test.images))
    models = {role: ocr_system.Model(p.info, _runner(p, threads), batch=_batch(p)) for role, p in parts.items()}
    system = ocr_system.System(models["det"], models["rec"], models.get("cls"), drop_score)
    images = list(test.images[:n])
    t0 = time.perf_counter()
    answers, _ = ocr_system.read(system, images)
    seconds = time.perf_counter() - t0
    st = parts["rec"].info.settings  # lines compared as the recognizer's own metric compares them (import.nfkc)
    scores = ocr_system.end_to_end(answers, test.polys[:n], test.texts[:n], bool(st["ignore_space"]), bool(st["nfkc"]))
    out = {"det_hmean": round(scores["hmean"], 4), "det_precision": round(scores["precision"], 4),
           "det_recall": round(scores["recall"], 4), "e2e_acc": round(scores["e2e_acc"], 4),
           "lines": int(scores["lines"]), "pages": n, "seconds_per_page": round(seconds / max(1, n), 3),
           "on": f"the detector's test split, first {n} pages (data.source {config['data']['source']})"}
    print(f"package: OCR system end to end: {out['e2e_acc']:.1%} of {out['lines']} lines read exactly, det hmean "
          f"{out['det_hmean']:.4f}, {n} test pages")
    return out


def _config_of(spec: Any) -> dict[str, Any]:
    m = artifacts.verify(spec.dir, ("package",)).manifest
    return {k: v for k, v in m["config"].items() if k != "package"}


def _batch(spec: Any) -> int:
    return int((spec.doc.get("batching") or {}).get("max_batch_size") or 1)


def _runner(spec: Any, threads: int) -> ocr_system.Run:
    """The package's model on its own engine in this process: one input (whatever the feed's key) -> outputs by
    public name."""
    from pipeline import engines
    from pipeline.serving import predictor

    run = engines.bind(predictor.load_engine(spec, spec.engine, threads), spec.io, str(spec.files[0]))
    name = spec.io.inputs[0].name

    def run_(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        (x,) = feeds.values()
        return run({name: x})

    return run_


def _variant(spec: Any) -> str:
    """The variant a part's package shipped (`pipe package`'s metrics.variant: e.g. openvino-int8, export-legacy)."""
    return str(artifacts.verify(spec.dir, ("package",)).manifest.get("metrics", {}).get("variant") or "")


def _readme(parts: dict[str, Any], variants: dict[str, str], system: dict[str, Any]) -> str:
    m = system["measured"]
    rows = "\n".join(f"| {role} | `{p.name}` | {p.task.name} | {p.precision} | {variants[role]} | {p.engine} |"
                     for role, p in parts.items())
    return f"""# OCR system: {', '.join(parts)}

Serve it: `pipe serve .` (127.0.0.1:8000), then

    curl -s localhost:8000/v1/ocr -H 'Content-Type: application/json' \\
         -d '{{"images": ["<base64 PNG or JPEG>"]}}'

answers `{{"pages": [[{{"points": [[x, y] x 4], "text": "...", "score": 0.99}}, ...]]}}`: per page its lines in reading
order, points in the page's own pixels, lines scoring below {system['drop_score']} dropped. Each part also answers on
its own: `/v1/models/<det|cls|rec>/predict` and the Open Inference Protocol's `/v2/models/<name>/infer`.

| part | model | task | precision | variant | engine |
|---|---|---|---|---|---|
{rows}

Measured when packaged, in-process on this package's engines, {m['on']}: {m['e2e_acc']:.1%} of {m['lines']} lines
read exactly; detection hmean {m['det_hmean']:.4f} (precision {m['det_precision']:.4f}, recall {m['det_recall']:.4f});
{m['seconds_per_page']:.2f} s per page, one page at a time.
"""
