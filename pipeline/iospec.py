"""One description of a model's tensors (STYLE §13), made once from the trained model and carried in every
manifest's `interface` (`inputs`, `outputs`); export, compress, package, the engines and the server read it.

    from pipeline import iospec
    desc = iospec.IO.from_interface(manifest["interface"])
    desc.inputs[0].name, desc.logits().name            # what the engines feed and fetch, by name
    feeds = desc.feeds({"input_ids": ids, "token_type_ids": types}, where="request")

A tensor is (name, dtype, shape with -1 for dynamic axes; axis 0 is the batch), plus `alias`, the public
name where the program's own differs (Paddle names saved outputs `fetch_name_<i>`), and `role`, what a task
reads from it (`logits` for classification). In Python `name` is the program's (what the engines feed and
fetch) and `public` the user's; in a manifest's `interface` and serving.yaml an entry's `name` is the public
one, with the program's as `program_name` where it differs (the engines' detail, read back here). Entries
written before that (`name: fetch_name_0, alias: logits`) still load: `Tensor.from_dict` maps them.

Feed and fetch by name everywhere: ONNX made from the legacy program and OpenVINO reading the legacy
`.pdmodel` list inputs in reverse order, and positional feeding raises nothing and answers wrong
(notes/paddle-stack-facts.md §14). No paddle import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import numpy as np

from pipeline.errors import InputError

DTYPES = ("float32", "float16", "int64", "int32", "bool")
LOGITS = "logits"


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]  # -1 = dynamic; axis 0 is the batch
    alias: str = ""  # the public name, where the program's own name differs
    role: str = ""  # outputs: what a task reads ("logits"); inputs: ""

    @property
    def public(self) -> str:
        """The name users see (requests, responses, docs): the alias if any, else the program's name."""
        return self.alias or self.name

    def to_dict(self) -> dict[str, Any]:
        """As manifests and serving.yaml list it: `name` the public name, `program_name` the program's where
        it differs."""
        d: dict[str, Any] = {"name": self.public, "dtype": self.dtype, "shape": list(self.shape)}
        if self.name != self.public:
            d["program_name"] = self.name
        if self.role:
            d["role"] = self.role
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "Tensor":
        """An entry of either layout: `name` public and `program_name` the program's (from now on), or
        `name` the program's and `alias` public (manifests and serving.yaml written before)."""
        try:
            name, dtype, shape = d["name"], d["dtype"], tuple(int(s) for s in d["shape"])
            program, alias = d.get("program_name"), d.get("alias")
            ok = (isinstance(name, str) and name and dtype in DTYPES and len(shape) >= 1 and shape[0] == -1
                  and all(s == -1 or s >= 1 for s in shape)
                  and all(v is None or isinstance(v, str) for v in (program, alias))
                  and not (program and alias))
        except (KeyError, TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise InputError(f"{where}: a tensor needs a name (and at most one of program_name, alias), a dtype "
                             f"of {', '.join(DTYPES)} and a shape with a -1 batch axis, "
                             f"got {dict(d) if isinstance(d, Mapping) else d!r}")
        role = str(d.get("role") or "")
        if program:  # the program's name beside the public one
            return cls(program, dtype, shape, name if name != program else "", role)
        return cls(name, dtype, shape, alias if alias and alias != name else "", role)

    def check(self, a: np.ndarray, where: str) -> np.ndarray:
        """`a` fed as this tensor: its dtype (ints and floats widen or narrow only within their kind) and
        every fixed axis; one line naming the tensor otherwise."""
        a = np.asarray(a)
        kind = np.dtype(self.dtype).kind
        if a.dtype.kind != kind and not (kind == "f" and a.dtype.kind in "iu") and not (kind == "i" and a.dtype.kind == "u"):
            raise InputError(f"{where}: input {self.public!r}: expected {self.dtype}, got {a.dtype}")
        if a.ndim != len(self.shape) or any(s != -1 and s != d for s, d in zip(self.shape, a.shape)):
            raise InputError(f"{where}: input {self.public!r}: expected shape {_shape(self.shape)}, "
                             f"got {list(a.shape)}")
        return np.ascontiguousarray(a, dtype=self.dtype)


@dataclass(frozen=True)
class IO:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # the interface's other keys

    @classmethod
    def from_interface(cls, iface: Mapping[str, Any], where: str = "interface") -> "IO":
        """From a manifest's `interface`. An output named or aliased `logits` (every manifest before roles
        existed) gets the logits role; so does the only output. Not for a task other than classification
        (interface["task"]): its outputs have no role unless the manifest gives one."""
        try:
            ins = tuple(Tensor.from_dict(d, f"{where}: inputs") for d in iface["inputs"])
            outs = [Tensor.from_dict(d, f"{where}: outputs") for d in iface["outputs"]]
        except (KeyError, TypeError):
            raise InputError(f"{where}: needs lists of inputs and outputs") from None
        if not ins or not outs:
            raise InputError(f"{where}: needs at least one input and one output")
        legacy = (iface.get("task") or {}).get("name", "classification") == "classification"
        if legacy and not any(o.role for o in outs):
            named = [i for i, o in enumerate(outs) if LOGITS in (o.name, o.alias)]
            for i in named or ([0] if len(outs) == 1 else []):
                outs[i] = replace(outs[i], role=LOGITS)
        io_ = cls(ins, tuple(outs), {k: v for k, v in iface.items() if k not in ("inputs", "outputs")})
        for kind, tensors in (("input", io_.inputs), ("output", io_.outputs)):
            names = [n for t in tensors for n in {t.name, t.alias} - {""}]  # a tensor may be aliased as itself
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise InputError(f"{where}: two {kind}s are named {dup!r}")
        return io_

    def to_interface(self) -> dict[str, Any]:
        return {**self.extra, "inputs": [t.to_dict() for t in self.inputs],
                "outputs": [t.to_dict() for t in self.outputs]}

    def with_program_names(self, inputs: list[str], outputs: list[str], where: str) -> "IO":
        """The same tensors under the names a saved program gave them (in the order it lists them, which
        for inputs is the order of the InputSpecs); the public name stays as `alias`."""
        if len(inputs) != len(self.inputs) or len(outputs) != len(self.outputs):
            raise InputError(f"{where}: the program has {len(inputs)} inputs and {len(outputs)} outputs, the "
                             f"interface {len(self.inputs)} and {len(self.outputs)}")

        def renamed(t: Tensor, real: str) -> Tensor:
            return replace(t, name=real, alias=t.public)

        return replace(self, inputs=tuple(renamed(t, n) for t, n in zip(self.inputs, inputs)),
                       outputs=tuple(renamed(t, n) for t, n in zip(self.outputs, outputs)))

    def logits(self) -> Tensor:
        found = [o for o in self.outputs if o.role == LOGITS]
        if len(found) != 1:
            raise InputError(f"interface: {len(found)} outputs have the logits role "
                             f"({', '.join(o.public for o in self.outputs)}); set model.logits_output")
        return found[0]

    def main(self) -> Tensor:
        """The output a one-number summary reports (parity's headline): the logits if one output has that
        role, else the first output."""
        found = [o for o in self.outputs if o.role == LOGITS]
        return found[0] if len(found) == 1 else self.outputs[0]

    def input(self, name: str) -> Tensor:
        return _find(self.inputs, name, "input")

    def output(self, name: str) -> Tensor:
        return _find(self.outputs, name, "output")

    def feeds(self, arrays: Mapping[str, np.ndarray], where: str) -> dict[str, np.ndarray]:
        """Named arrays (by program or public name) -> the engines' feed dict, keyed by program name: every
        input present, none unknown, dtypes and fixed axes right, one batch size; one line otherwise."""
        out: dict[str, np.ndarray] = {}
        for key in arrays:
            try:
                t = self.input(key)
            except InputError:
                raise InputError(f"{where}: unknown input {key!r}; the model takes "
                                 f"{', '.join(repr(t.public) for t in self.inputs)}") from None
            out[t.name] = t.check(arrays[key], where)
        missing = [t.public for t in self.inputs if t.name not in out]
        if missing:
            raise InputError(f"{where}: missing input {missing[0]!r}; the model takes "
                             f"{', '.join(repr(t.public) for t in self.inputs)}")
        sizes = {name: len(a) for name, a in out.items()}
        if len(set(sizes.values())) > 1:
            a, b = list(sizes)[:2] if len(sizes) == 2 else _disagree(sizes)
            raise InputError(f"{where}: inputs {self.input(a).public!r} and {self.input(b).public!r} have "
                             f"batch sizes {sizes[a]} and {sizes[b]}")
        return out

    def batch(self, feeds: Mapping[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
        """Rows lo:hi of every input."""
        return {k: v[lo:hi] for k, v in feeds.items()}


def _find(tensors: tuple[Tensor, ...], name: str, kind: str) -> Tensor:
    for t in tensors:
        if name in (t.name, t.alias):
            return t
    raise InputError(f"no {kind} named {name!r} (the model has {', '.join(repr(t.public) for t in tensors)})")


def _disagree(sizes: dict[str, int]) -> tuple[str, str]:
    first = next(iter(sizes))
    return first, next(k for k, v in sizes.items() if v != sizes[first])


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join("N" if i == 0 else ("?" if s == -1 else str(s)) for i, s in enumerate(shape)) + "]"


def num_rows(feeds: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(feeds.values())))
