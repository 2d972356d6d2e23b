"""Knowledge distillation in `pipe train` (`distill.teacher`): the frozen teacher called as the student is,
and PaddleSlim's `Distill` over the two (`distill.engine=paddleslim`) with its first-step check.

    pipe train --config examples/digits.yaml --run runs/student --set distill.teacher=runs/exp1/train

The train stage loads and verifies the teacher and computes the loss; paddle is imported inside functions.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from pipeline.config import DistillConfig
from pipeline.errors import InputError
from pipeline.nets import models


def teacher_logits(paddle: Any, teacher: Any, student_call: models.Call, call: models.Call,
                   outs: models.Outputs) -> Any:
    """The teacher as a layer called the student's way (PaddleSlim's Distill passes the student's arguments
    on to it) returning its logits alone; its own sublayers are under `net.`."""

    class TeacherLogits(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.net = teacher

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            feeds = {**dict(zip(student_call.names, args)), **kwargs}  # by position or by name
            return outs.logits_of(call(self.net, feeds))

    return TeacherLogits()


def distiller(model: Any, net: Any, teacher: Any, num_classes: int, d: DistillConfig) -> Any:
    """PaddleSlim's `Distill` over the student `model` (as trained: DataParallel-wrapped `net` on N ranks)
    and the frozen `teacher` (of `teacher_logits`): KL at temperature T (weight alpha * T^2) between their
    logit layers, plus an L2 term per `distill.pairs` feature pair. `convert_fn=False`: the default
    monkey-patches paddle.nn.functional process-wide (see the facts note)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Setuptools is replacing distutils")
        from paddleslim.dygraph.dist import Distill

    layers = [{"layers_name": [_logit_layer(model, num_classes, "student"),
                               _logit_layer(teacher, num_classes, "teacher")],
               "loss_function": "KLLoss", "reduction": "batchmean", "temperature": d.temperature,
               "weight": d.alpha * d.temperature ** 2, "io": ["output", "output"], "idx": [None, None]}]
    prefix = "_layers." if model is not net else ""
    student_names = {n for n, _ in net.named_sublayers()}
    teacher_names = {n for n, _ in teacher.net.named_sublayers()}
    for pair in filter(None, (p.strip() for p in d.pairs.split(","))):
        s_name, eq, t_name = pair.partition("=")
        s_name, t_name = s_name.strip(), t_name.strip()
        if not eq or s_name not in student_names or t_name not in teacher_names:
            raise InputError(f"distill.pairs {pair!r}: expected student_layer=teacher_layer naming sublayers "
                             f"of each model (student has e.g. {', '.join(sorted(student_names)[:6])})")
        layers.append({"layers_name": [prefix + s_name, "net." + t_name], "loss_function": "DistanceLoss",
                       "mode": "l2",
                       "weight": d.feature_weight, "io": ["output", "output"], "idx": [None, None]})
    distill = Distill([{"model_name_pairs": [["student_0", "teacher_0"]], "layers": layers}],
                      model, teacher, convert_fn=False, return_model_outputs=True)
    # Skip its first-call "useless forward": with convert_fn=False every hook is already in place, and
    # that extra training-mode forward would update BatchNorm statistics and draw dropout masks once
    # more on every (re)start, breaking bit-exact resume. `check_outputs` does its check instead.
    distill._check_hook_output = True
    return distill


def check_outputs(paddle: Any, distill: Any, logits: Any | None, model_name: str) -> None:
    """First step: every hooked output is one tensor, pairs match in shape, and the student's logit
    layer really produced its output (a model whose last Linear is not its head would distil the
    wrong tensor)."""
    outs = distill._output_tensor_dict
    for cfg in distill._loss_config_list:
        s_name, t_name = cfg["layers_name"]
        s_out, t_out = outs["student_0"].get(s_name), outs["teacher_0"].get(t_name)
        names = f"{s_name.split('#')[0].removeprefix('_layers.')}={t_name.split('#')[0].removeprefix('net.')}"
        if not isinstance(s_out, paddle.Tensor) or not isinstance(t_out, paddle.Tensor):
            raise InputError(f"distill.pairs {names}: a layer returned no single tensor")
        if s_out.shape != t_out.shape:
            raise InputError(f"distill.pairs {names}: output shapes differ "
                             f"({list(s_out.shape)} vs {list(t_out.shape)})")
    head = outs["student_0"][distill._loss_config_list[0]["layers_name"][0]]
    if logits is not None and not np.array_equal(head.numpy(), logits.numpy()):
        raise InputError(f"distill: the student's last Linear layer is not its output; use "
                         f"--set distill.engine=plain for model {model_name}")


def _logit_layer(net: Any, num_classes: int, who: str) -> str:
    """The name of `net`'s last Linear layer with `num_classes` outputs: its logit layer, checked
    against the real output on the first step."""
    import paddle

    names = [n for n, m in net.named_sublayers() if isinstance(m, paddle.nn.Linear)
             and m.weight.shape[-1] == num_classes]
    if not names:
        raise InputError(f"distill: the {who} has no Linear layer with {num_classes} outputs to distil from; "
                         "use --set distill.engine=plain")
    return names[-1]
