"""paddle2onnx 2.1.0 called one way for every stage, and the one repair its output needs.

Call `convert` in a child process only (stages/export.py, pipeline/quantize.py, stages/import_.py): on a
program it cannot convert paddle2onnx aborts the process. No optimizer pass: its default (polygraphy) sets
POLYGRAPHY_AUTOINSTALL_DEPS=1, i.e. may pip-install during the export, and leaves temporary files in the
working directory; onnxruntime and OpenVINO optimise anyway.

The repair: on programs that build a shape at run time (PP-OCRv4's recognizer: the SVTR neck's reshapes),
paddle2onnx feeds a rank-0 scalar into a Concat of rank-1 pieces. The file passes onnx's checker but does
not load ("Concat.6 ... All inputs to Concat must have same rank. Input 2 has rank 0 != 1" in
onnxruntime, "Accessing out-of-range dimension" in OpenVINO; notes/paddle-stack-facts.md §17). Each such
input is reshaped to [1] before the Concat, which is what the program meant; a model without them is
left byte-for-byte as paddle2onnx wrote it.
"""

from __future__ import annotations

from pathlib import Path

_SHAPE_1 = "pipe_rank1_shape"


def convert(model: Path, params: Path, dest: Path, opset: int) -> int:
    """paddle2onnx of a program (`.json` PIR or `.pdmodel` legacy) to `dest`, repaired; returns how many
    Concat inputs the repair reshaped."""
    import paddle2onnx

    paddle2onnx.export(str(model), str(params), str(dest), opset_version=opset, enable_onnx_checker=True,
                       optimize_tool="none")
    return repair_rank0_concat(Path(dest))


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
