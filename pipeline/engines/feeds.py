"""The feed check every engine's `run` makes: a feed dict holds exactly the program's inputs, by name."""

from __future__ import annotations

from typing import Any

from pipeline.errors import PipeError


def check(feeds: Any, names: frozenset[str], inputs: list[str], where: str) -> None:
    """Nothing when `feeds`' keys are `names` (the program's inputs); else one line naming the first unknown
    or missing input."""
    try:
        if feeds.keys() == names:
            return
    except AttributeError:
        raise PipeError(f"{where}: run() takes a dict of input name -> array, got {type(feeds).__name__}") from None
    takes = ", ".join(repr(n) for n in inputs)
    unknown = [k for k in feeds if k not in names]
    if unknown:
        raise PipeError(f"{where}: unknown input {unknown[0]!r}; the model takes {takes}")
    missing = next(n for n in inputs if n not in feeds)
    raise PipeError(f"{where}: missing input {missing!r}; the model takes {takes}")
