"""A training run's checkpoints: `<run>/checkpoints/step-NNNNNN/`, each an artifact of stage `checkpoint`.

`last` and `best` are one-line pointer files beside them naming a step directory (written by
`pipe train` with `artifacts.write_text_atomic`). Here: listing, the newest checkpoint that verifies,
pruning, and the plain-data parts of a checkpoint's `state.json` and `optimizer.safetensors` (RNG
states, optimizer keys by parameter position). Paddle is passed in by the caller, never imported here.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts
from pipeline.errors import InputError, PipeError

STAGE = "checkpoint"


def step_dirs(ckpt_dir: Path) -> list[Path]:
    """The committed `step-NNNNNN/` directories, oldest first (a `.tmp-` one is a write in progress or junk)."""
    if not ckpt_dir.is_dir():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.startswith("step-") and ".tmp-" not in p.name)


def step_of(name: str) -> int:
    """The step of a `step-NNNNNN` checkpoint name."""
    return int(name.removeprefix("step-"))


def read_pointer(ckpt_dir: Path, name: str) -> str | None:
    p = ckpt_dir / name
    return p.read_text().strip() if p.is_file() else None


def newest_verified(ckpt_dir: Path) -> Path | None:
    """`last` if it verifies, else the newest checkpoint that does (a crash may have left junk)."""
    pointer = ckpt_dir / "last"
    candidates = []
    if pointer.is_file():
        candidates.append(ckpt_dir / pointer.read_text().strip())
    candidates += list(reversed(step_dirs(ckpt_dir)))
    for c in candidates:
        try:
            artifacts.verify(c, (STAGE,))
            return c
        except InputError:
            continue
    return None


def prune(ckpt_dir: Path, keep_last: int) -> None:
    """Remove all but the newest `keep_last` checkpoints, keeping the ones `best` and `last` point to."""
    keep = {read_pointer(ckpt_dir, "best"), read_pointer(ckpt_dir, "last")}
    for p in step_dirs(ckpt_dir)[:-keep_last]:
        if p.name not in keep:
            shutil.rmtree(p)


def optimizer_tensors(state: dict[str, Any], param_names: list[str]) -> dict[str, Any]:
    """An optimizer's `state_dict()` keyed by parameter position ("3:moment1_0"), without the scheduler:
    Paddle's keys embed auto-generated names that shift when a process creates layers in another order."""
    out = {}
    names = sorted(enumerate(param_names), key=lambda kv: -len(kv[1]))
    for key, value in state.items():
        if key == "LR_Scheduler":
            continue
        if isinstance(value, dict):  # master_weights under O2
            for k2, v2 in value.items():
                out[f"{key}/{_param_index(k2, names)}"] = v2
        else:
            out[_param_index(key, names)] = value
    return out


def _param_index(key: str, names: list[tuple[int, str]]) -> str:
    for i, pname in names:
        if key == pname:
            return f"{i}:"
        if key.startswith(pname + "_"):
            return f"{i}:{key[len(pname) + 1:]}"
    raise PipeError(f"optimizer state key {key!r} matches no parameter")


def optimizer_state(saved: dict[str, Any], param_names: list[str]) -> dict[str, Any]:
    """`optimizer_tensors` undone: keys by this process's parameter names, for `set_state_dict`."""
    state: dict[str, Any] = {}
    for key, value in saved.items():
        head, _, rest = key.partition("/")
        ref = rest if rest else head
        i, _, suffix = ref.partition(":")
        pname = param_names[int(i)]
        full = f"{pname}_{suffix}" if suffix else pname
        if rest:
            state.setdefault(head, {})[full] = value
        else:
            state[full] = value
    return state


def rng_state(paddle: Any) -> dict[str, Any]:
    """Paddle's, numpy's and Python's global RNG states, as JSON."""
    return {"paddle": [s.__getstate__() for s in paddle.get_rng_state()],
            "numpy": jsonable(np.random.get_state()), "python": jsonable(random.getstate())}


def restore_rng(paddle: Any, doc: dict[str, Any]) -> None:
    """Set the global RNG states saved by `rng_state`."""
    states = paddle.get_rng_state()
    for s, saved_state in zip(states, doc["paddle"]):
        s.__setstate__(tuple(saved_state))
    paddle.set_rng_state(states)
    np_state = doc["numpy"]
    np.random.set_state((np_state[0], np.asarray(np_state[1], np.uint32), *np_state[2:]))
    py = doc["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))


def jsonable(v: Any) -> Any:
    """`v` with numpy arrays, numpy scalars and tensors as plain lists and numbers, for `state.json`."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if hasattr(v, "numpy"):
        return v.numpy().tolist()
    if isinstance(v, (np.integer, np.floating)):
        return v.item()
    return v
