"""paddle2onnx 2.1.0 called one way for every stage, and the one repair its output needs.

Call `convert` in a child process only (`in_child`; pipeline/quantize.py's child calls it too): on a
program it cannot convert paddle2onnx aborts the process. No optimizer pass: its default (polygraphy) sets
POLYGRAPHY_AUTOINSTALL_DEPS=1, i.e. may pip-install during the export, and leaves temporary files in the
working directory; onnxruntime and OpenVINO optimise anyway.

The repair: on programs that build a shape at run time (PP-OCRv4's recognizer: the SVTR neck's reshapes),
paddle2onnx feeds a rank-0 scalar into a Concat of rank-1 pieces. The file passes onnx's checker but does
not load ("Concat.6 ... All inputs to Concat must have same rank. Input 2 has rank 0 != 1" in
onnxruntime, "Accessing out-of-range dimension" in OpenVINO; notes/paddle-stack-facts.md §17). Each such
input is reshaped to [1] before the Concat, which is what the program meant; a model without them is
left byte-for-byte as paddle2onnx wrote it.

And the failure before it: on a program with an interpolation (PP-OCRv4's detector: 6 nearest_interp in its
FPN neck) paddle2onnx 2.1.0 stops ("the 0th elementwise MUST be ir::FloatAttribute" at pd_op.nearest_interp;
the CLI exits 255 and writes nothing), since Paddle's translation to PIR stores the op's `scale` as float64
and paddle2onnx reads float32. Such a program is translated to PIR here (a legacy one) and given to
paddle2onnx with those scales as float32 (`_f32_interp_scales`, in a scratch folder; the artifact's own
model.json is not touched); a program without them goes to paddle2onnx as given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.errors import PipeError

_SHAPE_1 = "pipe_rank1_shape"
_TIMEOUT = 600


def in_child(model: Path, params: Path, dest: Path, opset: int, threads: int) -> dict[str, int]:
    """`convert` in a child process, in a scratch working directory (nothing the converter drops survives);
    returns what the repairs changed (`convert`). Paddle's default PIR mode reads either format."""
    spec = {"model": str(Path(model).resolve()), "params": str(Path(params).resolve()),
            "dest": str(Path(dest).resolve()), "opset": opset}
    env = dict(os.environ, FLAGS_enable_pir_api="1", GLOG_minloglevel="2",
               OMP_NUM_THREADS=str(threads), PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory(prefix="pipe-p2o-") as cwd:
        try:
            proc = subprocess.run([sys.executable, "-m", "pipeline.p2o", json.dumps(spec)], capture_output=True,
                                  text=True, env=env, cwd=cwd, timeout=_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            raise PipeError(f"paddle2onnx did not finish within {_TIMEOUT} s") from None
    if proc.returncode != 0 or not Path(dest).is_file():
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise PipeError(f"paddle2onnx failed (exit {proc.returncode}): {lines[-1] if lines else 'no ' + Path(dest).name}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def convert(model: Path, params: Path, dest: Path, opset: int) -> dict[str, int]:
    """paddle2onnx of a program (`.json` PIR or `.pdmodel` legacy) to `dest`, repaired; returns how many
    interpolation scales were given as float32 and how many Concat inputs were reshaped (0 and 0: as given)."""
    import paddle2onnx

    with tempfile.TemporaryDirectory(prefix="pipe-p2o-pir-") as scratch:
        model, params, scales = _f32_interp_scales(Path(model), Path(params), Path(scratch))
        paddle2onnx.export(str(model), str(params), str(dest), opset_version=opset, enable_onnx_checker=True,
                           optimize_tool="none")
    return {"interp_scales": scales, "concat_inputs": repair_rank0_concat(Path(dest))}


def _f32_interp_scales(model: Path, params: Path, scratch: Path) -> tuple[Path, Path, int]:
    """The program paddle2onnx can read: (program, params, scales changed). One with an interpolation op is
    first translated to PIR if legacy (as paddle2onnx would, into `scratch`), then its interpolations' float64
    `scale` entries are written as float32 into a copy in `scratch`; any other program is returned as given."""
    from pipeline import runtime
    from pipeline.nets import paddle_program

    prog = paddle_program.Program(model, params)
    if prog.format == "legacy":
        if not any("interp" in t for t in paddle_program.read(prog).op_types):
            return model, params, 0
        # as paddle2onnx translates it (its upsamplings kept: the float32 scales below are the repair)
        paddle_program.translate_to_pir(runtime.import_paddle(), model.with_suffix(""), scratch / "translated",
                                        upsample_as_tile=False)
        model, params = scratch / "translated.json", scratch / "translated.pdiparams"
    doc = json.loads(model.read_text(encoding="utf-8"))
    entries = paddle_program.f64_interp_scales(doc)
    if not entries:
        return model, params, 0
    for v in entries:
        v["#"] = "0.a_f32"
    fixed = scratch / "f32_scales.json"
    fixed.write_text(json.dumps(doc), encoding="utf-8")
    return fixed, params, len(entries)


def repair_rank0_concat(path: Path) -> int:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    m = onnx.load(str(path))
    rank: dict[str, int] = {}
    inferred = shape_inference.infer_shapes(m).graph
    for vi in [*inferred.value_info, *inferred.input, *inferred.output]:
        if vi.type.tensor_type.HasField("shape"):
            rank[vi.name] = len(vi.type.tensor_type.shape.dim)
    rank.update({t.name: len(t.dims) for t in m.graph.initializer})
    for n in m.graph.node:
        if n.op_type == "Constant":
            rank.update({n.output[0]: len(a.t.dims) for a in n.attribute if a.name == "value"})
    nodes, fixed = [], 0
    for n in m.graph.node:
        if n.op_type == "Concat":
            for k, name in enumerate(list(n.input)):
                if rank.get(name) == 0:
                    out = f"{name}__pipe_rank1"
                    nodes.append(helper.make_node("Reshape", [name, _SHAPE_1], [out], name=f"{n.name}__pipe_rank1_{k}"))
                    n.input[k] = out
                    fixed += 1
        nodes.append(n)
    if fixed:
        m.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), _SHAPE_1))
        del m.graph.node[:]
        m.graph.node.extend(nodes)
        onnx.checker.check_model(m)
        onnx.save(m, str(path))
    return fixed


if __name__ == "__main__":
    from pipeline import runtime

    runtime.import_paddle(int(os.environ.get("OMP_NUM_THREADS", "1")))
    job = json.loads(sys.argv[1])
    print(json.dumps(convert(Path(job["model"]), Path(job["params"]), Path(job["dest"]), int(job["opset"]))))
