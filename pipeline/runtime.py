"""Importing paddle on our terms: thread count first, then restore the logging paddle changes."""

from __future__ import annotations

import contextlib
import io
import logging
import math
import os
import sys
import warnings
from pathlib import Path
from typing import Any


def import_paddle(threads: int | None = None) -> Any:
    """Import paddle once. Paddle forces OMP_NUM_THREADS=1 when it is unset and sets the root
    logger to INFO; we set the threads ourselves and put the root logger back."""
    if "paddle" in sys.modules:
        return sys.modules["paddle"]
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(threads or os.cpu_count() or 1)
    os.environ.setdefault("GLOG_minloglevel", "2")  # C++ INFO/WARNING lines off the user's terminal
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    caught = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stderr(caught):
        warnings.filterwarnings("ignore", message="No ccache found")
        import paddle
    # Paddle prints a warning for any OMP_NUM_THREADS above 1; we chose the count on purpose.
    for line in caught.getvalue().splitlines():
        if "OMP_NUM_THREADS" not in line:
            print(line, file=sys.stderr)
    warnings.filterwarnings("ignore", message="When training, we now always track global mean and variance")
    root.setLevel(level)
    root.handlers[:] = handlers
    return paddle


def threads_per_process(nproc: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, nproc))


def load_safetensors(paddle: Any, path: Any) -> dict[str, Any]:
    """`paddle.load(..., safetensors=True)`: tensors only, never a pickle. A file that is not a
    safetensors file (a pickle among them) is bad input naming the file, and nothing of it runs."""
    from safetensors import SafetensorError

    from pipeline.errors import InputError

    try:
        return paddle.load(str(path), safetensors=True)
    except (SafetensorError, OSError) as e:
        raise InputError(f"{path}: not a safetensors file ({str(e)[:80]})") from None


def bf16_unsupported() -> str:
    """'' if oneDNN bf16 kernels can run here, else why not. `paddle.amp.is_bfloat16_supported()` says
    True on CPUs without avx512_bf16 (see the facts note), so read the CPU flags."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return "cannot read /proc/cpuinfo to check for avx512_bf16"
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        return "this CPU has no avx512_bf16/amx_bf16: oneDNN bf16 kernels cannot run here"
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").lower()
    if isa and isa not in ("all", "default") and "bf16" not in isa and "amx" not in isa and "avx10" not in isa:
        return f"ONEDNN_MAX_CPU_ISA={isa.upper()} keeps oneDNN off its bf16 kernels"
    return ""


def gpu_count(paddle: Any) -> int:
    """CUDA devices Paddle can use (0 on the CPU build)."""
    if not paddle.is_compiled_with_cuda():
        return 0
    return int(paddle.device.cuda.device_count())


def device_index(device: str, flag: str = "device") -> int | None:
    """'cpu' -> None; 'gpu' / 'gpu:N' -> N (0 by default); anything else is bad input naming `flag`."""
    kind, _, idx = device.partition(":")
    if kind == "cpu" and not idx:
        return None
    if kind == "gpu" and (not idx or idx.isdigit()):
        return int(idx or 0)
    from pipeline.errors import InputError

    raise InputError(f"{flag}: expected cpu, gpu or gpu:N, got {device!r}")


def available_cores() -> int:
    """The cores this process may use: its CPU affinity, capped by the cgroup's CPU quota (cgroup v2
    /sys/fs/cgroup/cpu.max, "max 100000" when unlimited; v1 cpu.cfs_quota_us), not the host's count."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota() -> float | None:
    try:
        q, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if q == "max" else int(q) / int(period)
    except (OSError, ValueError):
        pass
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return None if q <= 0 else q / period
    except (OSError, ValueError):
        return None
