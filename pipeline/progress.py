"""Progress events from a training process and the terminal view of them.

Rank 0 emits events (dicts). In-process they go straight to a `View`; under the launcher they are
appended to `<log_dir>/events.jsonl` and the parent `pipe` process tails that file into its `View`,
so the progress bar lives where the terminal is.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

Emit = Callable[[dict[str, Any]], None]


class View:
    """Rich progress bar on a terminal; one line per epoch everywhere (logs, CI, pipes)."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.progress: Progress | None = None
        self.task = None

    def __call__(self, ev: dict[str, Any]) -> None:
        kind = ev.get("event")
        if kind == "start":
            self._start(ev)
        elif kind == "step" and self.progress is not None:
            self.progress.update(
                self.task, completed=ev["step"],
                info=f"epoch {ev['epoch'] + 1}/{ev['epochs']}  loss {ev['loss']:.4f}  {ev['ips']:.0f} samples/s",
            )
        elif kind == "epoch":
            self.console.print(
                f"epoch {ev['epoch'] + 1}/{ev['epochs']}  step {ev['step']}  loss {ev['train_loss']:.4f}  "
                f"val_loss {ev['val_loss']:.4f}  " + "".join(f"{k} {v:.4f}  " for k, v in ev.items()
                                                             if k.startswith(("val_", "general_", "held_out_"))
                                                             and k != "val_loss") + f"lr {ev['lr']:.2e}  "
                f"{ev['ips']:.0f} samples/s" + ("  (best)" if ev.get("best") else "")
            )
        elif kind == "notice":
            self.console.print(f"[yellow]note:[/yellow] {ev['text']}")
        elif kind == "done":
            self.close()

    def _start(self, ev: dict[str, Any]) -> None:
        self.close()
        if ev.get("resumed_from"):
            self.console.print(f"Resuming training from {ev['resumed_from']} (step {ev['start_step']})")
        if not self.console.is_terminal:
            return
        self.progress = Progress(
            TextColumn("[bold]train[/bold]"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=self.console, transient=True,
        )
        self.task = self.progress.add_task("train", total=ev["total_steps"], completed=ev["start_step"], info="")
        self.progress.start()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def file_emitter(path: Path) -> Emit:
    f = open(path, "a", encoding="utf-8")

    def emit(ev: dict[str, Any]) -> None:
        f.write(json.dumps(ev) + "\n")
        f.flush()

    return emit


class Tail(threading.Thread):
    """Follow an events.jsonl file into a View until stopped."""

    def __init__(self, path: Path, view: Callable[[dict[str, Any]], None]):
        super().__init__(daemon=True)
        self.path, self.view = path, view
        self._stop_evt = threading.Event()

    def run(self) -> None:
        pos, buf = 0, ""
        while True:
            stopping = self._stop_evt.is_set()
            if self.path.exists():
                with open(self.path, encoding="utf-8") as f:
                    f.seek(pos)
                    buf += f.read()
                    pos = f.tell()
                *lines, buf = buf.split("\n")
                for line in lines:
                    if line.strip():
                        self.view(json.loads(line))
            if stopping:
                return
            self._stop_evt.wait(0.2)

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=5)
