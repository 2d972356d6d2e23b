"""VisualDL scalars of a training run, where PaddleDetection/PaddleOCR users look for curves.

    visualdl --logdir runs/exp1/vdl       # one run; --logdir runs shows every run side by side

Rank 0 of `pipe train` writes `<run>/vdl/vdlrecords.NNNNNN.log`, step = the global optimizer step:
`train/loss`, `train/lr`, `train/samples_per_s` every `train.log_interval` steps; `val/loss`,
`val/acc` (and `amp/loss_scale` when the GradScaler is on) every epoch. A fresh run starts with an
empty directory. A resume continues the same curves: the records up to the checkpoint's step are
copied (with their wall times) into a new file, which is closed and fsynced before the old files go;
VisualDL shows one file per directory, the newest by name, so the new one is then appended to.
visualdl is imported here, inside functions: `pipe --help` never loads it.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from pathlib import Path
from typing import Any, Callable

from pipeline import artifacts

STEP_TAGS = {"loss": "train/loss", "lr": "train/lr", "ips": "train/samples_per_s"}
EPOCH_TAGS = {"val_loss": "val/loss", "val_acc": "val/acc", "loss_scale": "amp/loss_scale"}
_NAME = re.compile(r"vdlrecords\.(\d+)\.log$")


class Scalars:
    """[rank0] One run's VisualDL writer. The directory is prepared, and the command to view it printed, at
    the first record: a run that fails before its first logged step leaves no curves behind."""

    def __init__(self, vdl_dir: Path, resume_step: int | None, emit: Callable[[dict[str, Any]], None]):
        self.vdl_dir, self.resume_step, self.emit = vdl_dir, resume_step, emit
        self.path: Path | None = None
        self._w: Any = None

    def _add(self, tag: str, value: float, step: int) -> None:
        if self._w is None:
            self.emit({"event": "notice", "text": f"training curves: visualdl --logdir {shlex.quote(str(self.vdl_dir))}"})
            self.path = _prepare(self.vdl_dir, self.resume_step)
            self._w = _writer(self.path)
        self._w.add_scalar(tag=tag, value=value, step=step)

    def step(self, step: int, loss: float, lr: float, ips: float) -> None:
        for key, value in (("loss", loss), ("lr", lr), ("ips", ips)):
            self._add(STEP_TAGS[key], value, step)

    def epoch(self, step: int, row: dict[str, Any]) -> None:
        """An epoch's row of metrics.csv: every val_ column (val/loss, val/acc, val/map...), a fine-tune's general_
        and held_out_ columns (general/acc, held_out/acc) and the loss scale
        ("" when the scaler is off)."""
        tags = {**{k: "val/" + k.removeprefix("val_") for k in row if k.startswith("val_")},
                **{k: g + "/" + k.removeprefix(g + "_") for g in ("general", "held_out") for k in row
                   if k.startswith(g + "_")}, **EPOCH_TAGS}
        for key, tag in tags.items():
            if row.get(key, "") != "":
                self._add(tag, row[key], step)

    def flush(self) -> None:
        """Before a checkpoint commits: every record up to its step is on disk (the writer's thread
        writes asynchronously; a crash right after the commit must not lose what a resume keeps)."""
        if self._w is not None:
            self._w.flush()
            artifacts.fsync(self.path)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()


class Off:
    """Ranks other than 0 write nothing."""

    def step(self, *args: Any) -> None: ...

    def epoch(self, *args: Any) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def open_run(vdl_dir: Path, resume_step: int | None, emit: Callable[[dict[str, Any]], None]) -> Scalars:
    """[rank0] The run's writer: fresh (the directory emptied) when `resume_step` is None, else
    holding exactly the records with step <= `resume_step`, each (tag, step) once. Says once how to
    look at it (at the first record)."""
    return Scalars(vdl_dir, resume_step, emit)


def _prepare(vdl_dir: Path, resume_step: int | None) -> Path:
    """The file to write: a fresh directory's first, or after a resume a new one holding the old records
    up to `resume_step`."""
    if resume_step is None:
        if vdl_dir.exists():
            shutil.rmtree(vdl_dir)
        vdl_dir.mkdir(parents=True)
        return vdl_dir / "vdlrecords.000001.log"
    vdl_dir.mkdir(parents=True, exist_ok=True)
    old = sorted(p for p in vdl_dir.iterdir() if p.is_file() and "vdlrecords" in p.name)
    kept: dict[tuple[str, int], tuple[int, float]] = {}
    for p in old:  # several files only after a crash mid-rewrite: the newest is a copy of the others
        for tag, values in _read(p).items():
            for v in values:
                if v.id <= resume_step:
                    kept.setdefault((tag, v.id), (v.timestamp, v.value))
    seq = max((int(m.group(1)) for p in old if (m := _NAME.search(p.name))), default=0) + 1
    path = vdl_dir / f"vdlrecords.{seq:06d}.log"  # sorts after the old ones: VisualDL reads the newest
    w = _writer(path)
    for (tag, step), (walltime, value) in sorted(kept.items(), key=lambda kv: (kv[0][1], kv[1][0], kv[0][0])):
        w.add_scalar(tag=tag, value=value, step=step, walltime=walltime)
    w.close()
    artifacts.fsync(path)
    for p in old:  # only now: the new file is complete and closed
        p.unlink()
    artifacts.fsync(vdl_dir)
    return path


def _writer(path: Path) -> Any:
    from visualdl import LogWriter

    # VisualDL appends to an existing file (its local filesystem opens every write with "ab") and
    # says so on stdout; that is what a resume wants, the message is noise
    with contextlib.redirect_stdout(io.StringIO()):
        return LogWriter(logdir=str(path.parent), file_name=path.name)


def _read(path: Path) -> dict[str, list[Any]]:
    """Every scalar record of one file by tag (VisualDL's Record.Value: id = step, timestamp, value)."""
    from google.protobuf.message import DecodeError
    from visualdl import LogReader

    try:
        reader = LogReader(file_path=str(path))
    except (DecodeError, IndexError):  # it parses the whole file at once; one torn record fails it all
        return _read_prefix(path)
    return {tag: reader.get_data("scalar", tag) for tag in reader.get_tags().get("scalar", [])}


def _read_prefix(path: Path) -> dict[str, list[Any]]:
    """The records before a torn one (a full disk, a power cut mid-write), in VisualDL's framing."""
    from google.protobuf.message import DecodeError
    from visualdl.proto.record_pb2 import Record
    from visualdl.reader.record_reader import RecordReader

    out: dict[str, list[Any]] = {}
    for raw in RecordReader(str(path)).get_all():
        rec = Record()
        try:
            rec.ParseFromString(raw)
        except DecodeError:
            break
        if not rec.values:  # a header whose body never reached the disk
            break
        if rec.values[0].WhichOneof("one_value") == "value":
            out.setdefault(rec.values[0].tag, []).append(rec.values[0])
    return out
