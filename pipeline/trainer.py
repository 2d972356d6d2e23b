"""One rank of `pipe train`: the training loop (`Trainer`), run in the `pipe train` process when the world is one
process, else in each rank that `python -m paddle.distributed.launch` starts (stages/train.py's `_worker_main`).

    worker(cfg, out_dir, ckpt_dir, resume_from, emit)   # build, resume, fit; rank 0 writes the artifact

The stage (stages/train.py) checks the config, takes the run's lock, resolves `--resume` and launches the ranks;
everything a rank does is here: the model (built, or an imported program as a layer: pipeline/nets/program_layer.py),
its data loader, AMP and loss scaling, the steps, evaluation, early stopping, crash-safe checkpoints
(pipeline/checkpoint.py), and rank 0's metrics, curves and manifest. Test hooks: PIPE_FAULT_NAN_STEPS,
PIPE_FAULT_NAN_PARAMS_AT_STEP and PIPE_FAULT_CRASH_AFTER_STEP (comma-separated steps).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from pipeline import (artifacts, batches, checkpoint, config as config_mod, data as data_mod, distillation, iospec, job,
                      runtime, tasks, trainlog)
from pipeline.config import RunConfig
from pipeline.errors import DivergedError, GateError, InputError, PipeError
from pipeline.nets import models, program_layer, weights
from pipeline.progress import Emit


# train.deterministic: flag -> (value, GPU-only). Each is set where this build accepts it, else recorded.
_DETERMINISTIC_FLAGS = {
    "FLAGS_cudnn_deterministic": (True, True),  # cuDNN picks deterministic convolution algorithms
    "FLAGS_embedding_deterministic": (1, True),  # embedding gradients without atomic adds
    "FLAGS_cpu_deterministic": (True, False),  # CPU reductions in a fixed order (Paddle 2.x builds)
    "FLAGS_sort_sum_gradient": (True, False),  # dygraph: a tensor's gradients summed in a fixed order
}


def check_program_task(cfg: RunConfig, init: weights.Source) -> None:
    """An imported program is fine-tuned for its own task: model.task must name it; and the guard judges by lines
    rehearsal does not draw (finetune.held_out is not finetune.general's source)."""
    spec = str((init.manifest["interface"].get("task") or {}).get("spec") or "classification")
    if cfg.model.task != spec:
        raise InputError(f"model.init {init.path}: an imported {spec} model; model.task is {cfg.model.task} "
                         f"(set model.task: {spec}, or --set model.task={spec})")
    f = cfg.finetune
    if f.held_out and f.held_out == (f.general or getattr(tasks.get(spec), "default_source", "")):
        raise InputError(f"finetune.held_out {f.held_out}: the source rehearsal draws from (finetune.general); the "
                         f"guard would judge by the style it rehearses: name another source, or '' to judge by "
                         f"finetune.general's val lines")



def l2sp_penalty(paddle: Any, anchors: list[tuple[Any, Any]], alpha: float) -> Any:
    """finetune.l2sp (Li, Grandvalet, Davoine, "Explicit inductive bias for transfer learning with convolutional
    networks", 2018): alpha/2 * sum ||w - w0||^2 over (weight, its pretrained value w0) pairs; its gradient pulls each
    weight back by alpha * (w - w0)."""
    return alpha / 2 * paddle.add_n([((w - w0) ** 2).sum() for w, w0 in anchors])


def _stop_workers(loader: Any) -> None:
    """Stop a DataLoader's persistent worker processes now. Paddle keeps them in the loader's iterator until that is
    garbage-collected or the process exits: a training run inside a longer-lived process (pipe all, the tests) left
    them behind, one sleeping process per worker holding ~0.9 GB."""
    it = getattr(loader, "_iterator", None)  # only set with persistent_workers (paddle/io/reader.py)
    if it is not None:
        it._try_shutdown_all()
        loader._iterator = None


@dataclass
class Ctx:
    """What a rank knows about the job."""

    cfg: RunConfig
    rank: int
    world: int
    emit: Emit
    paddle: Any
    amp_active: bool = False
    deterministic: dict[str, Any] = field(default_factory=dict)


def worker(cfg: RunConfig, out_dir: Path, ckpt_dir: Path, resume_from: Path | None, emit: Emit) -> None:
    world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
    paddle = runtime.import_paddle(runtime.threads_per_process(1))
    rank = 0
    if world > 1:
        import paddle.distributed as dist

        dist.init_parallel_env()
        rank, world = dist.get_rank(), dist.get_world_size()
    paddle.set_device(_device(cfg, paddle, world))
    with _deterministic(paddle, cfg.train.deterministic, cfg.train.seed) as det:
        ctx = Ctx(cfg, rank, world, emit if rank == 0 else (lambda ev: None), paddle, deterministic=det)
        if det.get("unavailable"):
            ctx.emit({"event": "notice", "text": f"train.deterministic: {', '.join(det['unavailable'])} not available "
                                                 f"on this build; set {', '.join(det['set']) or 'no flag'} "
                                                 "(recorded in the manifest)"})
        Trainer(ctx, out_dir, ckpt_dir).fit(resume_from)


@contextlib.contextmanager
def _deterministic(paddle: Any, on: bool, seed: int) -> Iterator[dict[str, Any]]:
    """Set the flags of `_DETERMINISTIC_FLAGS` that this build accepts; yield what was set and what
    could not be, for the manifest. The flags are put back afterwards: a world-size-1 run shares its
    process with the stages that follow it."""
    if not on:
        yield {"requested": False}
        return
    wanted: dict[str, Any] = {}
    before: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    for flag, (value, gpu_only) in _DETERMINISTIC_FLAGS.items():
        if gpu_only and not paddle.is_compiled_with_cuda():
            unavailable[flag] = "GPU-only; this Paddle is not compiled with CUDA"
            continue
        try:
            before[flag] = paddle.get_flags([flag])[flag]
        except ValueError:  # paddle.set_flags refuses what get_flags refuses: not a public flag here
            unavailable[flag] = f"not a flag of paddlepaddle {paddle.__version__}"
            continue
        wanted[flag] = value
    paddle.set_flags(wanted)
    try:
        # seeds and the data order are fixed in every run; CPU kernels are bit-identical run to run at a
        # given thread count (MKL splits its sums by thread), so the count is recorded with them
        yield {"requested": True, "set": wanted, "unavailable": unavailable, "seed": seed,
               "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    finally:
        paddle.set_flags(before)


def _device(cfg: RunConfig, paddle: Any, world: int) -> str:
    """A GPU when one is asked for or (single process) simply there; the CPU otherwise."""
    if not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0:
        return "cpu"
    if world > 1:
        return f"gpu:{paddle.distributed.ParallelEnv().device_id}"  # the launcher's FLAGS_selected_gpus
    gpus = [g for g in cfg.dist.gpus.split(",") if g.strip()]
    return f"gpu:{gpus[0].strip()}" if gpus else "gpu:0"


class Trainer:
    """The training loop of one rank. Rank 0 alone writes checkpoints, metrics and the artifact."""

    def __init__(self, ctx: Ctx, out_dir: Path, ckpt_dir: Path):
        self.ctx, self.out_dir, self.ckpt_dir = ctx, out_dir, ckpt_dir
        self.cfg, self.p = ctx.cfg, ctx.paddle

    # ---- setup
    def _build(self) -> None:
        paddle, cfg, ctx = self.p, self.cfg, self.ctx
        t = cfg.train
        init = weights.source(cfg.model.init) if cfg.model.init else None  # a bad path fails before any work
        self.program = init if init is not None and init.kind == "program" else None
        self.anchors: list[tuple[Any, Any]] = []  # finetune.l2sp's (weight, pretrained value), an import's only
        if self.program is not None:
            self._build_program(self.program)
        else:
            self._build_own(init)
        self.sched = self._scheduler()
        clip = paddle.nn.ClipGradByGlobalNorm(t.grad_clip_norm) if t.grad_clip_norm > 0 else None
        params = self.net.parameters()
        if t.optimizer == "adamw":
            self.opt = paddle.optimizer.AdamW(learning_rate=self.sched, parameters=params,
                                              weight_decay=t.weight_decay, grad_clip=clip)
        else:
            self.opt = paddle.optimizer.Momentum(learning_rate=self.sched, momentum=t.momentum, parameters=params,
                                                 weight_decay=t.weight_decay or None, grad_clip=clip)
        a = cfg.amp
        on_gpu = "gpu" in str(paddle.device.get_device())
        ctx.amp_active = a.level != "O0" and on_gpu
        if a.level != "O0" and not on_gpu:
            ctx.emit({"event": "notice", "text": "AMP has no effect on CPU: training runs in float32 (amp.active: false)"})
        if ctx.amp_active and a.level == "O2":
            self.net, self.opt = paddle.amp.decorate(self.net, self.opt, level="O2", dtype=a.dtype)
        self.scaler = paddle.amp.GradScaler(
            enable=ctx.amp_active and a.dtype == "float16", init_loss_scaling=a.init_loss_scaling,
            incr_ratio=a.incr_ratio, decr_ratio=a.decr_ratio, incr_every_n_steps=a.incr_every_n_steps,
            decr_every_n_nan_or_inf=a.decr_every_n_nan_or_inf, use_dynamic_loss_scaling=a.use_dynamic_loss_scaling,
        )
        self.model = paddle.DataParallel(self.net) if ctx.world > 1 else self.net
        self.param_names = [p.name for p in params if not p.stop_gradient]
        self.teacher = self._teacher() if cfg.distill.teacher else None
        self.distill = (distillation.distiller(self.model, self.net, self.teacher, self.num_classes, cfg.distill)
                        if self.teacher is not None and cfg.distill.engine == "paddleslim" else None)
        self._distill_checked = False

    def _judged_by(self) -> None:
        t = self.cfg.train
        self.monitor = t.monitor or f"val_{self.task.monitor}"
        self.epoch_fields = trainlog.epoch_fields(self.task.metrics)
        # what the best checkpoint is judged by besides val_loss: the monitored metric, or the task's own
        self.metric_key = self.monitor if self.monitor != "val_loss" else f"val_{self.task.monitor}"

    def _build_own(self, init: weights.Source | None) -> None:
        """A model pipe builds (models.build) on data pipe loads (data.load), from `init`'s tensors if given."""
        paddle, cfg, ctx = self.p, self.cfg, self.ctx
        t = cfg.train
        self.task = tasks.get(cfg.model.task)
        self.data = data_mod.load(cfg.data, getattr(self.task, "data", None))
        tasks.check_data(self.task, self.data.targets, cfg.data.source)
        for text in self.data.notes:  # e.g. COCO boxes clipped to their image; also in the manifest's "data"
            ctx.emit({"event": "notice", "text": text})
        self.num_classes = len(self.data.labels)
        if cfg.distill.teacher and not getattr(self.task, "logits", False):
            raise InputError(f"distill.teacher: knowledge distillation reads logits; task {self.task.name} has "
                             "none (distill a classifier, or train without distill.teacher)")
        self._judged_by()
        paddle.seed(t.seed)
        np.random.seed(t.seed)
        random.seed(t.seed)
        self.vocab_size = len(self.data.preprocessing["vocab"]) if self.data.is_text else None
        net = self._model(cfg.model.name)
        # every rank loads the same file before the optimizer and DataParallel see the parameters
        self.init = weights.apply(paddle, net, init, cfg.model.init_strict, ctx.emit) if init else None
        where = f"--model {cfg.model.name}"
        self.call = models.calling(net, self.data.input_names, where)
        self.outputs, self.output_tensors = self._probe(net, self.call, cfg.model.logits_output, where)
        self.info = tasks.Info(self.data.labels, tasks.settings(self.task, cfg.postprocess), t.label_smoothing,
                               self.outputs.logits)
        tasks.check_outputs(self.task, self._probe_named(net), self.info, where)
        paddle.seed(t.seed * 1000 + ctx.rank)  # dropout masks differ per rank
        self.net = net
        self.sampler = batches.GlobalBatchSampler(len(self.data.train), t.batch_size, ctx.rank, ctx.world, t.seed)
        if len(self.sampler) == 0:
            raise InputError(f"train.batch_size {t.batch_size}: larger than the training split "
                             f"({len(self.data.train)} samples)")
        self.spe = len(self.sampler)
        dataset = batches.FeedDataset(self.data.train, self.data.preprocessing, self._targets)
        self.loader = paddle.io.DataLoader(
            dataset, batch_sampler=self.sampler, collate_fn=dataset.collate,
            num_workers=cfg.data.num_workers, persistent_workers=cfg.data.persistent_workers and cfg.data.num_workers > 0,
        )

    def _build_program(self, init: weights.Source) -> None:
        """A pipe import's program as the model (pipeline/nets/program_layer.py), on its task's own data (ocr_rec: line
        images of any width, batched by the task), with the finetune section's guard: finetune.general's val lines
        measured every epoch against the pretrained model's score on them, its train lines mixed into batches."""
        paddle, cfg, ctx = self.p, self.cfg, self.ctx
        t, f = cfg.train, cfg.finetune
        where = f"model.init {init.path}"
        iface = init.manifest["interface"]
        check_program_task(cfg, init)
        spec = cfg.model.task
        self.task = tasks.get(spec)
        if not hasattr(self.task, "training_batch"):
            raise InputError(f"{where}: pipe train fine-tunes imported ocr_rec models; task {spec} has no training "
                             "batches (tasks/__init__.py)")
        if cfg.distill.teacher:
            raise InputError(f"distill.teacher: distillation trains pipe's own models, not an imported program "
                             f"({where})")
        self._judged_by()
        self.info = self.task.info_of(iface)
        source = cfg.data.source if cfg.data.source != config_mod.DataConfig.source else self.task.default_source
        self.data = self.task.load_data(dataclasses.replace(cfg.data, source=source), self.info)
        if not len(self.data.train):  # a label file, or a folder of val/test files only: pipe import measures on it
            have = [s for s in ("val", "test") if len(getattr(self.data, s))]
            raise InputError(f"--data {source}: no train split to train on (only {' and '.join(have)}); pipe train "
                             f"needs a folder holding a train label file (train.txt)")
        self.general = self.task.load_data(self._sized(f.general or self.task.default_source, f.general_lines),
                                           self.info)
        self.held_out = self._held_out()
        paddle.seed(t.seed)
        np.random.seed(t.seed)
        net = program_layer.build(paddle, init.path / Path(weights.program_files(init.manifest)[0]).with_suffix(""))
        feed = net.feeds[0]
        self.call = models.calling(net, (feed,), where)
        self.outputs = models.Outputs("tensor", (self.task.OUTPUT,), "")
        self.output_tensors = ()
        _, feeds = next(iter(self.task.batches(self.data.train, self.info, 2, limit=2)))
        net.eval()
        with paddle.no_grad():
            probe = {self.task.OUTPUT: net(paddle.to_tensor(feeds[self.info.settings.get("input", feed)])).numpy()}
        net.train()
        tasks.check_outputs(self.task, probe, self.info, where)
        self.init = {"path": str(init.path.resolve()), "kind": "program", "sha256": artifacts.sha256_file(init.file),
                     "manifest_sha256": init.manifest_sha256, "loaded": len(net.names), "shape_mismatch": [],
                     "missing": [], "unexpected": [], "source": init.manifest.get("source")}
        ctx.emit({"event": "notice", "text": f"{where}: fine-tuning the imported program ({len(net.ops)} ops, "
                                             f"{len(net.parameters())} trainable tensors; batch-norm statistics "
                                             f"frozen) from lr {f.lr:g}"})
        trainable = net.trainable_in_order()
        frozen = int(round(len(trainable) * f.freeze_early))
        for p in trainable[:frozen]:  # finetune.freeze_early: the first blocks keep the pretrained weights
            p.stop_gradient = True
        # finetune.l2sp: each trained weight with the pretrained value it is pulled back to
        self.anchors = [(p, p.detach().clone()) for p in trainable[frozen:]] if f.l2sp > 0 else []
        said = [f"{frozen} of {len(trainable)} trainable tensors frozen"] if frozen else []
        said += [f"L2-SP {f.l2sp:g} towards the pretrained weights"] if f.l2sp else []
        if said:
            ctx.emit({"event": "notice", "text": "finetune: " + ", ".join(said)})
        paddle.seed(t.seed * 1000 + ctx.rank)  # dropout masks differ per rank
        self.net = net
        g = round(t.batch_size * f.mix / ctx.world) * ctx.world if len(self.general.train) else 0
        if t.batch_size - g < ctx.world:
            raise InputError(f"finetune.mix {f.mix:g}: leaves no line of train.batch_size {t.batch_size} for the data")
        user = batches.GlobalBatchSampler(len(self.data.train), t.batch_size - g, ctx.rank, ctx.world, t.seed)
        if len(user) == 0:
            raise InputError(f"train.batch_size {t.batch_size}: larger than the training split "
                             f"({len(self.data.train)} lines)")
        self.sampler = batches.MixedBatchSampler(user, len(self.general.train), g)
        self.spe = len(self.sampler)
        dataset = batches.OwnedDataset(self.task, self.info, self.data.train, self.general.train, self.sampler,
                                       t.seed, f.augment)
        # batches are made in this thread: Paddle's DataLoader runs collate in a thread of its own, and a line
        # that fails there (an image it cannot read) hung the loop instead of failing it
        self.loader = _Batches(paddle, self.sampler, dataset.collate)
        cut = 4 + len(self.task.metrics)  # metrics.csv: the general and held-out sets' columns after the val ones
        self.epoch_fields = [*self.epoch_fields[:cut], *(f"{g}_{m}" for g in self._guard_sets()
                                                         for m in self.task.metrics), *self.epoch_fields[cut:]]

    def _sized(self, source: str, val_lines: int) -> Any:
        """The run's data config for `source`, generating enough lines (where it generates) that its val split,
        0.15 of them, holds about `val_lines`."""
        return dataclasses.replace(self.cfg.data, source=source, ocr_lines=max(10, round(val_lines / 0.15)))

    def _held_out(self) -> Any:
        """finetune.held_out's lines (its val split; its test split when a label file is all it has), or None when
        it is '' (the guard then judges by finetune.general's val lines)."""
        f = self.cfg.finetune
        if not f.held_out:
            return None
        try:
            held = self.task.load_data(self._sized(f.held_out, f.held_out_lines), self.info)
        except InputError as e:  # the data's message names --data / data.source: say which key it came from
            raise InputError(f"finetune.held_out {f.held_out}: {e}") from None
        lines = held.val if len(held.val) else held.test
        if not len(lines):
            raise InputError(f"finetune.held_out {f.held_out}: no val or test lines to judge forgetting by")
        return lines

    def _guard_sets(self) -> dict[str, Any]:
        """The sets measured every epoch besides val: finetune.general's val lines, and finetune.held_out's."""
        sets = {"general": self.general.val}
        if self.held_out is not None:
            sets["held_out"] = self.held_out
        return sets

    def _guarded_by(self) -> str:
        """The set the guard judges by: held_out, unless it is off (then the general lines)."""
        return "held_out" if self.held_out is not None else "general"

    def _targets(self, y: np.ndarray, feeds: dict[str, np.ndarray]) -> Any:
        return self.task.targets(y, feeds, self.info)

    def _probe_named(self, net: Any) -> dict[str, np.ndarray]:
        """The model's outputs by name, as numpy, on 2 training samples in eval mode (for the task's check)."""
        paddle = self.p
        feeds = self.data.train.feeds(np.arange(min(2, len(self.data.train))), self.data.preprocessing)
        was = net.training
        net.eval()
        with paddle.no_grad():
            out = self.outputs.named(self.call(net, {k: paddle.to_tensor(v) for k, v in feeds.items()}))
        if was:
            net.train()
        return {k: v.numpy() for k, v in out.items()}

    def _model(self, name: str) -> Any:
        shapes = self.data.input_shapes
        return models.build(name, self.num_classes, next(iter(shapes.values())), self.vocab_size, input_shapes=shapes)

    def _probe(self, net: Any, call: models.Call, logits_output: str,
               where: str) -> tuple[models.Outputs, tuple[iospec.Tensor, ...]]:
        """The model's outputs named and measured on 2 training samples (models.probe); with a dynamic input
        axis (text: ids of any length up to max_len) a second call at half that length finds the output axes
        that follow it."""
        full = self.data.train.feeds(np.arange(min(2, len(self.data.train))), self.data.preprocessing)
        feeds = [full]
        dynamic = {t.name: {i for i, d in enumerate(t.shape) if i and d == -1} for t in self.data.inputs()}
        if any(dynamic.values()):
            feeds.append({k: v[tuple(slice(0, max(1, n // 2)) if i in dynamic[k] else slice(None)
                                     for i, n in enumerate(v.shape))] for k, v in full.items()})
        return models.probe(net, call, feeds, logits_output if getattr(self.task, "logits", False) else None, where)

    def _teacher(self) -> Any:
        """The frozen teacher of knowledge distillation: a verified train artifact on the same data, wrapped so
        that called as the student is called it returns its logits (by its own model.logits_output)."""
        src = artifacts.verify(Path(self.cfg.distill.teacher), ("train",))
        iface = src.manifest["interface"]
        now = self.data.interface()
        if any(iface.get(k) != now[k] for k in ("inputs", "labels", "preprocessing")):
            raise InputError(f"distill.teacher {src.path}: trained on inputs {_describe(iface.get('inputs'))} with "
                             f"{len(iface.get('labels') or [])} labels; this data has {_describe(now['inputs'])} "
                             f"and {len(self.data.labels)}")
        if self.data.is_text:
            vocab = json.loads(src.file("vocab.json").read_text(encoding="utf-8"))
            if vocab != self.data.preprocessing["vocab"]:
                raise InputError(f"distill.teacher {src.path}: its vocabulary differs from this data's")
        model_cfg = src.manifest["config"]["model"]
        teacher = self._model(model_cfg["name"])
        teacher.set_state_dict(runtime.load_safetensors(self.p, src.file("model.safetensors")))
        teacher.eval()
        for p in teacher.parameters():
            p.stop_gradient = True
        where = f"distill.teacher {src.path}"
        call = models.calling(teacher, self.data.input_names, where)
        outs, _ = self._probe(teacher, call, model_cfg.get("logits_output", ""), where)
        self.teacher_acc = src.manifest["metrics"].get("test_acc")
        wrapped = distillation.teacher_logits(self.p, teacher, self.call, call, outs)
        wrapped.eval()
        return wrapped

    def _scheduler(self) -> Any:
        lr_mod, t = self.p.optimizer.lr, self.cfg.train
        total = t.epochs * self.spe
        warm = int(round(t.warmup_epochs * self.spe))
        t = dataclasses.replace(t, lr=self.cfg.finetune.lr) if self.program is not None else t
        if t.schedule == "cosine":
            sched = lr_mod.CosineAnnealingDecay(t.lr, T_max=max(1, total - warm))
        elif t.schedule == "step":
            sched = lr_mod.StepDecay(t.lr, step_size=t.step_epochs * self.spe, gamma=t.gamma)
        else:
            sched = lr_mod.LambdaDecay(t.lr, lambda _: 1.0)
        return lr_mod.LinearWarmup(sched, warm, 0.0, t.lr) if warm > 0 and t.lr > 0 else sched

    # ---- the loop
    def fit(self, resume_from: Path | None) -> None:
        self._build()
        st = _State()
        if resume_from is not None:
            st = self._load(resume_from)
        ctx, t = self.ctx, self.cfg.train
        if self.program is not None and st.baseline and self.held_out is not None \
                and f"held_out_{self.task.monitor}" not in st.baseline:
            # a checkpoint of a pipe before finetune.held_out: no pretrained score on it; it goes on as it began
            self.held_out = None
            self.epoch_fields = [k for k in self.epoch_fields if not k.startswith("held_out_")]
            ctx.emit({"event": "notice", "text": f"--resume {resume_from}: its run measured no held-out lines before "
                                                 f"its first step; the guard judges by the general lines, as it began"})
        if self.program is not None and not st.baseline:  # the pretrained model's scores, before any step
            st.baseline = {f"val_{k}": v for k, v in self._evaluate(self.data.val)[1].items()}
            for g, lines in self._guard_sets().items():
                st.baseline.update({f"{g}_{k}": v for k, v in self._evaluate(lines)[1].items()})
            m, j = self.task.monitor, self._guarded_by()
            sets = ", ".join(f"{g}_{m} {st.baseline[f'{g}_{m}']:.4f} on {len(lines)} lines"
                             for g, lines in self._guard_sets().items())
            ctx.emit({"event": "notice", "text": f"pretrained: val_{m} {st.baseline[f'val_{m}']:.4f}, {sets} "
                                                 f"(the guard keeps {j}_{m} within {self.cfg.finetune.max_drop:g})"})
        if ctx.rank == 0 and self.ckpt_dir.is_dir():
            for junk in self.ckpt_dir.glob("*.tmp-*"):  # left by a crash mid-write; never read
                shutil.rmtree(junk) if junk.is_dir() else junk.unlink()
        total_steps = t.epochs * self.spe
        ctx.emit({"event": "start", "total_steps": total_steps, "start_step": st.step, "epochs": t.epochs,
                  "resumed_from": str(resume_from) if resume_from else None})
        from pipeline import vdl  # [rank0] VisualDL scalars; visualdl itself is imported on rank 0 only

        vdl_dir = self.out_dir.parent / "vdl"  # one VisualDL run per --run; logs/ holds environment dumps
        self.vdl = vdl.open_run(vdl_dir, st.step if resume_from else None, ctx.emit) if ctx.rank == 0 else vdl.Off()
        try:
            epoch = st.epoch
            while epoch < t.epochs and not st.stopped_early:
                self._train_epoch(epoch, st)
                epoch += 1
                st.epoch, st.batch = epoch, 0
                self._end_epoch(epoch - 1, st)
            self._finish(st)
        finally:
            self.vdl.close()
            _stop_workers(self.loader)
        ctx.emit({"event": "done"})

    def _train_epoch(self, epoch: int, st: "_State") -> None:
        paddle, ctx, t = self.p, self.ctx, self.cfg.train
        a = self.cfg.amp
        self.model.train()
        self.sampler.set_epoch(epoch, start=st.batch)
        fault_nan = _fault_steps("PIPE_FAULT_NAN_STEPS")
        t0, seen = time.perf_counter(), 0
        for b, (feeds, y) in enumerate(self.loader, start=st.batch):
            kd = None
            with paddle.amp.auto_cast(enable=ctx.amp_active, level=a.level, dtype=a.dtype):
                if self.distill is not None:
                    args, kwargs = self.call.split(feeds)  # Distill passes them on to the student and the teacher
                    try:  # a pair of mismatched shapes fails inside Distill's loss: name the pair instead
                        kd, out, _ = self.distill(*args, **kwargs)
                    except ValueError:
                        if not self._distill_checked:
                            distillation.check_outputs(paddle, self.distill, None, self.cfg.model.name)
                        raise
                else:
                    out = self.call(self.model, feeds)
                named = self.outputs.named(out)
            if self.distill is not None and not self._distill_checked:
                distillation.check_outputs(paddle, self.distill, named[self.info.logits], self.cfg.model.name)
                self._distill_checked = True
            loss = self._loss(named, feeds, y, kd)
            if st.step + 1 in fault_nan:  # test hook: behave as if this step's loss were NaN
                loss = loss * float("nan")
            value = self._global_loss(loss)  # [sync] host sync every step: the NaN guard needs it
            st.step += 1
            if not math.isfinite(value):
                self._skip(st)
            else:
                st.nonfinite_run = 0
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
                if ctx.amp_active and self.scaler._found_inf:
                    st.skipped += 1
            self.opt.clear_grad()
            lr = self.opt.get_lr()
            self.sched.step()
            st.batch = b + 1
            seen += t.batch_size
            st.step_rows.append({"step": st.step, "epoch": epoch, "loss": value, "lr": lr})
            ips = seen / max(1e-9, time.perf_counter() - t0)
            if st.step % t.log_interval == 0:
                ctx.emit({"event": "step", "step": st.step, "epoch": epoch, "epochs": t.epochs, "loss": value,
                          "lr": lr, "ips": ips})
                self.vdl.step(st.step, value, lr, ips)
            if t.checkpoint_every and st.step % t.checkpoint_every == 0 and st.batch < self.spe:
                self.vdl.flush()  # [rank0] the records up to this step on disk before the checkpoint commits
                self._save(st, best=False)
        # over the epoch's every finite step, those before a resume included (step_rows came back with the checkpoint)
        mine = [r["loss"] for r in st.step_rows if r["epoch"] == epoch and math.isfinite(r["loss"])]
        st.epoch_loss = float(np.mean(mine)) if mine else float("nan")
        st.epoch_ips = seen / max(1e-9, time.perf_counter() - t0)

    def _loss(self, named: dict[str, Any], feeds: dict[str, Any], y: Any, kd: Any = None) -> Any:
        F = self.p.nn.functional
        ce = self.task.loss(F, named, y, self.info)
        if self.anchors:
            ce = ce + l2sp_penalty(self.p, self.anchors, self.cfg.finetune.l2sp)
        if self.teacher is None:
            return ce
        logits = named[self.info.logits].astype("float32")
        d = self.cfg.distill
        if kd is not None:  # PaddleSlim Distill: alpha * T^2 * KL (+ feature terms), weighted in its config
            return kd.astype("float32") + (1 - d.alpha) * ce
        with self.p.no_grad():
            soft = F.softmax(self.teacher(**feeds).astype("float32") / d.temperature, axis=-1)
        kd = F.kl_div(F.log_softmax(logits / d.temperature, axis=-1), soft, reduction="batchmean")
        return d.alpha * kd * d.temperature ** 2 + (1 - d.alpha) * ce

    def _global_loss(self, loss: Any) -> float:
        if self.ctx.world == 1:
            return float(loss)
        import paddle.distributed as dist

        v = loss.detach().clone()
        dist.all_reduce(v)  # a NaN on any rank makes every rank skip: the ranks stay in step
        return float(v) / self.ctx.world

    def _skip(self, st: "_State") -> None:
        st.skipped += 1
        st.nonfinite_run += 1
        k = self.cfg.train.max_nonfinite_steps
        if st.nonfinite_run >= k:
            first = st.step - st.nonfinite_run + 1
            last = checkpoint.read_pointer(self.ckpt_dir, "last") or "none"
            raise DivergedError(f"loss NaN/Inf for {st.nonfinite_run} consecutive steps "
                                f"({first}-{st.step}); last good: {last}")

    def _end_epoch(self, epoch: int, st: "_State") -> None:
        self._sync_buffers()
        val_loss, val = self._evaluate(self.data.val)
        guarded = {f"{g}_{k}": v for g, lines in (self._guard_sets().items() if self.program is not None else ())
                   for k, v in self._evaluate(lines)[1].items()}
        t = self.cfg.train
        metric = val[self.metric_key.removeprefix("val_")]
        # every rank decides alike: each has the whole split's scores, from the same parameters
        improved = self._guard(guarded, st) and self._better(metric, val_loss, st.best_metric, st.best_loss)
        if improved:
            st.best_metric, st.best_loss, st.bad_epochs = metric, val_loss, 0
        else:
            st.bad_epochs += 1
        if t.patience and st.bad_epochs >= t.patience:
            st.stopped_early = True
        scale = float(self.scaler._scale) if self.scaler._enable else ""
        row = {"epoch": epoch, "step": st.step, "train_loss": st.epoch_loss, "val_loss": val_loss,
               **{f"val_{k}": v for k, v in val.items()}, **guarded,
               "lr": self.opt.get_lr(), "img_per_s": st.epoch_ips, "loss_scale": scale,
               "skipped_steps": st.skipped}
        st.epoch_rows.append(row)
        self.ctx.emit({"event": "epoch", **row, "epochs": t.epochs, "ips": st.epoch_ips, "best": improved})
        self.vdl.epoch(st.step, row)
        self.vdl.flush()  # [rank0] as in _train_epoch
        self._save(st, best=improved)

    def _sync_buffers(self) -> None:
        """Average BatchNorm statistics over ranks (sync_batch_norm has no CPU kernel)."""
        if self.ctx.world == 1:
            return
        import paddle.distributed as dist

        for name, buf in self.net.state_dict().items():
            if buf.stop_gradient and ("_mean" in name or "_variance" in name):
                dist.all_reduce(buf)
                buf.set_value(buf / self.ctx.world)

    def _better(self, metric: float, loss: float, best_metric: float | None, best_loss: float | None) -> bool:
        """Whether an epoch beats the best so far by train.monitor, a tie going to the other of (val_loss, the
        task's metric). The best checkpoint and patience both use it."""
        if best_metric is None or best_loss is None:
            return True
        up = metric > best_metric if self.task.maximize else metric < best_metric
        if self.monitor == "val_loss":
            return loss < best_loss or (loss == best_loss and up)
        return up or (metric == best_metric and loss < best_loss)

    def _evaluate(self, split: data_mod.Split) -> tuple[float, dict[str, float]]:
        """(mean loss, the task's metrics) over the whole split, the same on every rank, so every rank takes the
        same decisions. pipe's own models: every rank evaluates all of it with the same parameters (BatchNorm
        statistics synced), without a collective, and a metric over the whole split (detection's mAP) needs no
        gathering; an imported program's splits are shared among the ranks (`_evaluate_owned`)."""
        if self.program is not None:
            return self._evaluate_owned(split)
        paddle, F = self.p, self.p.nn.functional
        pos = np.arange(len(split))
        self.net.eval()
        info = tasks.Info(self.info.labels, self.info.settings, 0.0, self.info.logits)  # no smoothing in val_loss
        loss_sum, outs = 0.0, []
        with paddle.no_grad():
            for i in range(0, len(pos), 256):
                p = pos[i:i + 256]
                raw = split.feeds(p, self.data.preprocessing)
                y = np.asarray(split.y[split.idx[p]])
                feeds = {k: paddle.to_tensor(v) for k, v in raw.items()}
                named = self.outputs.named(self.call(self.net, feeds))
                loss_sum += float(self.task.loss(F, named, _tensors(paddle, self.task.targets(y, raw, info)), info)) * len(p)
                outs.append({k: v.astype("float32").numpy() if "float" in str(v.dtype) else v.numpy()
                             for k, v in named.items()})
        self.net.train()
        joined = {k: np.concatenate([o[k] for o in outs]) for k in outs[0]}
        found = self.task.metrics_of(joined, np.asarray(split.y[split.idx]), self.info)
        return loss_sum / len(pos), {k: float(found[k]) for k in self.task.metrics}

    def _evaluate_owned(self, split: Any) -> tuple[float, dict[str, float]]:
        """`_evaluate` for a task that owns its data: the split in the task's batches (ocr_rec: by width), each
        batch's loss and answers, scored by the task. An imported recognizer reads a line in ~0.1-0.2 s on a CPU
        core, so the ranks share the work (`_read_share`) and exchange what they read."""
        return self._scores(split, self._all_ranks(self._read_share(split)))

    def _read_share(self, split: Any) -> list[tuple[int, list[int], float, list[Any]]]:
        """This rank's share of the split, every world-th batch: (batch index, its positions in the split, its
        summed loss, its answers) for each."""
        paddle, F, task, ctx = self.p, self.p.nn.functional, self.task, self.ctx
        self.net.eval()
        mine = []
        with paddle.no_grad():
            for b, (pos, feeds) in enumerate(task.batches(split, self.info, 32)):
                if b % ctx.world != ctx.rank:
                    continue
                out = {task.OUTPUT: self.call(self.net, {k: paddle.to_tensor(v) for k, v in feeds.items()})}
                y = task.targets([split.texts[p] for p in pos], feeds, self.info)
                loss = float(task.loss(F, out, _tensors(paddle, y), self.info)) * len(pos)
                mine.append((b, pos, loss, task.decode({k: v.numpy() for k, v in out.items()}, self.info)))
        self.net.train()
        return mine

    def _scores(self, split: Any, read: list[tuple[int, list[int], float, list[Any]]]) -> tuple[float, dict[str, float]]:
        """(mean loss, the task's metrics) of the whole split from every rank's `_read_share`: the losses summed in
        batch order, as one process sums them, so every rank and every world size gets the same numbers."""
        lines = sum(len(pos) for _, pos, *_ in read)
        if sorted(b for b, *_ in read) != list(range(len(read))) or lines != len(split):
            raise PipeError(f"evaluation: the ranks read {lines} of {len(split)} lines in {len(read)} batches")
        loss_sum, answers = 0.0, [None] * len(split)
        for _, pos, loss, got in sorted(read, key=lambda batch: batch[0]):
            loss_sum += loss
            for p, a in zip(pos, got, strict=True):
                answers[p] = a
        found = self.task.score(answers, split, self.info)
        return loss_sum / max(1, len(split)), {k: float(found[k]) for k in self.task.metrics}

    def _all_ranks(self, items: list[Any]) -> list[Any]:
        """[sync] every rank's `items` (picklable), one list in rank order, on every rank."""
        if self.ctx.world == 1:
            return items
        import paddle.distributed as dist

        gathered: list[list[Any]] = []
        dist.all_gather_object(gathered, items)
        return [x for part in gathered for x in part]

    def _guard(self, guarded: dict[str, float], st: "_State") -> bool:
        """Whether an epoch kept the judged set (`_guarded_by`: finetune.held_out, or finetune.general) within
        finetune.max_drop of the pretrained model (always, for pipe's own models)."""
        if self.program is None:
            return True
        key = f"{self._guarded_by()}_{self.task.monitor}"
        drop = st.baseline[key] - guarded[key]
        return drop <= self.cfg.finetune.max_drop + 1e-12 if self.task.maximize else -drop <= self.cfg.finetune.max_drop

    # ---- checkpoints
    def _save(self, st: "_State", best: bool) -> None:
        """[rank0] writes; every rank first checks the (identical) parameters are finite."""
        paddle = self.p
        if _fault_steps("PIPE_FAULT_NAN_PARAMS_AT_STEP") & {st.step}:  # test hook: poison one weight
            p0 = self.net.parameters()[0]
            p0.set_value(p0 * float("nan"))
        for name, v in self.net.state_dict().items():
            if not bool(paddle.isfinite(v).all()):
                last = checkpoint.read_pointer(self.ckpt_dir, "last") or "none"
                raise DivergedError(f"parameter {name} is NaN/Inf at step {st.step}; "
                                    f"no checkpoint written; last good: {last}")
        if self.ctx.rank == 0:
            with job.critical():  # a stop signal waits until the checkpoint and its pointers are committed
                self._commit(st, best)
            if st.step in _fault_steps("PIPE_FAULT_CRASH_AFTER_STEP"):  # test hook: die like a killed process
                os._exit(137)
        if self.ctx.world > 1:
            import paddle.distributed as dist

            dist.barrier()  # others wait until rank 0 has committed

    def _commit(self, st: "_State", best: bool) -> None:
        paddle, name = self.p, f"step-{st.step:06d}"
        with artifacts.write_stage(self.ckpt_dir / name, checkpoint.STAGE, self.cfg.to_dict()) as w:
            paddle.save(self.net.state_dict(), str(w.dir / "model.safetensors"), safetensors=True)
            opt_tensors = checkpoint.optimizer_tensors(self.opt.state_dict(), self.param_names)
            paddle.save(opt_tensors, str(w.dir / "optimizer.safetensors"), safetensors=True)
            (w.dir / "state.json").write_text(json.dumps(self._state_doc(st), indent=1))
            trainlog.write_csv(w.dir / "steps.csv", trainlog.STEP_FIELDS, st.step_rows)
            trainlog.write_csv(w.dir / "metrics.csv", self.epoch_fields, st.epoch_rows)
            w.metrics = {"step": st.step, "epoch": st.epoch, f"best_{self.metric_key}": st.best_metric,
                         "best_val_loss": st.best_loss}
            time.sleep(float(os.environ.get("PIPE_FAULT_SLOW_CHECKPOINT", "0")))  # test hook: widen the window
        artifacts.write_text_atomic(self.ckpt_dir / "last", name)
        if best:
            artifacts.write_text_atomic(self.ckpt_dir / "best", name)
        checkpoint.prune(self.ckpt_dir, self.cfg.train.keep_last)

    def _state_doc(self, st: "_State") -> dict[str, Any]:
        return {
            "step": st.step, "epoch": st.epoch, "batch": st.batch, "skipped": st.skipped,
            "nonfinite_run": st.nonfinite_run, "best_metric": st.best_metric, "best_loss": st.best_loss,
            "bad_epochs": st.bad_epochs,
            "stopped_early": st.stopped_early, "world_size": self.ctx.world,
            "scheduler": self.sched.state_dict(), "scaler": checkpoint.jsonable(self.scaler.state_dict()),
            "rng": checkpoint.rng_state(self.p),
            "param_names": self.param_names, "config": self.cfg.to_dict(), "baseline": st.baseline,
        }

    def _load(self, path: Path) -> "_State":
        paddle = self.p
        art = artifacts.verify(path, (checkpoint.STAGE,))
        doc = json.loads(art.file("state.json").read_text())
        if len(doc["param_names"]) != len(self.param_names):
            raise InputError(f"--resume {path}: checkpoint has {len(doc['param_names'])} parameters, "
                             f"the model has {len(self.param_names)}")
        self.net.set_state_dict(runtime.load_safetensors(paddle, art.file("model.safetensors")))
        saved = runtime.load_safetensors(paddle, art.file("optimizer.safetensors"))
        opt_state = checkpoint.optimizer_state(saved, self.param_names)
        opt_state["LR_Scheduler"] = doc["scheduler"]
        with warnings.catch_warnings():  # Paddle always warns "unused values in state_dict": it checks nothing
            warnings.filterwarnings("ignore", message="There are some unused values")
            self.opt.set_state_dict(opt_state)
            self.sched.set_state_dict(doc["scheduler"])
        if doc["scaler"]:
            self.scaler.load_state_dict(doc["scaler"])
        checkpoint.restore_rng(paddle, doc["rng"])
        st = _State(step=doc["step"], epoch=doc["epoch"], batch=doc["batch"], skipped=doc["skipped"],
                    nonfinite_run=doc["nonfinite_run"], best_metric=doc.get("best_metric", doc.get("best_acc")),
                    best_loss=doc.get("best_loss"),
                    bad_epochs=doc["bad_epochs"], stopped_early=doc["stopped_early"],
                    baseline=doc.get("baseline") or {})
        st.step_rows = trainlog.read_csv(art.file("steps.csv"))
        st.epoch_rows = trainlog.read_csv(art.file("metrics.csv"))
        if st.best_loss is None and st.best_metric is not None:
            # written before train.monitor: its best was the first epoch to reach best_acc
            st.best_loss = next(r["val_loss"] for r in st.epoch_rows if r["val_acc"] == st.best_metric)
        return st

    # ---- the artifact
    def _rank_checksums(self) -> list[str]:
        """Every rank's parameter checksum: data-parallel ranks must end bit-identical."""
        h = hashlib.sha256()
        for name, v in sorted(self.net.state_dict().items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return self._all_ranks([h.hexdigest()[:15]])

    def _finish(self, st: "_State") -> None:
        """[rank0] evaluate the best checkpoint on the test split and write train/."""
        checksums = self._rank_checksums()  # [sync] a collective: every rank takes part
        if self.program is not None and st.best_metric is None:
            f, key = self.cfg.finetune, f"{self._guarded_by()}_{self.task.monitor}"
            seen = [f"{r[key]:.4f}" for r in st.epoch_rows]
            lines = "the held-out lines" if key.startswith("held_out") else "the general lines"
            raise GateError(f"finetune.max_drop {f.max_drop:g}: every epoch lost more on {lines} than that "
                            f"({key} {st.baseline[key]:.4f} pretrained, then {', '.join(seen)}); "
                            f"train/ not written: lower finetune.lr, raise finetune.mix or allow a larger drop")
        # every rank evaluates the best checkpoint on the test split (rank 0 alone would keep the others waiting in
        # the barrier below longer than gloo's timeout: an imported recognizer's splits take minutes on a CPU); its
        # val and general scores are its epoch's, measured on these same parameters when it was saved
        best = checkpoint.read_pointer(self.ckpt_dir, "best")
        best_dir = artifacts.verify(self.ckpt_dir / best, (checkpoint.STAGE,))
        self.net.set_state_dict(runtime.load_safetensors(self.p, best_dir.file("model.safetensors")))
        test_loss, test = self._evaluate(self.data.test)
        row = next(r for r in st.epoch_rows if r["step"] == checkpoint.step_of(best))
        val_loss, val = row["val_loss"], {k: row[f"val_{k}"] for k in self.task.metrics}
        guarded = {f"{g}_{k}": row[f"{g}_{k}"] for g in self._guard_sets() for k in self.task.metrics} \
            if self.program is not None else {}
        if self.ctx.rank == 0:
            with artifacts.write_stage(self.out_dir, "train", self.cfg.to_dict()) as w:
                shutil.copyfile(best_dir.file("model.safetensors"), w.dir / "model.safetensors")
                trainlog.write_csv(w.dir / "metrics.csv", self.epoch_fields, st.epoch_rows)
                trainlog.write_csv(w.dir / "steps.csv", trainlog.STEP_FIELDS, st.step_rows)
                trainlog.plot(w.dir / "curves.png", st.step_rows, st.epoch_rows, self.metric_key)
                if self.program is None and self.data.is_text:
                    (w.dir / "vocab.json").write_text(json.dumps(self.data.preprocessing["vocab"], ensure_ascii=False),
                                                      encoding="utf-8")
                # inputs from the data, outputs as the model returned them (the order export sees)
                if self.program is None:
                    w.interface = {**self.data.interface(self.output_tensors), "model": self.cfg.model.name,
                                   "task": {"name": self.task.name, "spec": self.cfg.model.task or "classification",
                                            "settings": self.info.settings}}
                else:  # the imported program's, unchanged: fine-tuning changes its weights only
                    w.interface = self.program.manifest["interface"]
                ips = [r["img_per_s"] for r in st.epoch_rows if r["img_per_s"]]
                w.metrics = {
                    **{f"test_{k}": v for k, v in test.items()}, "test_loss": test_loss,
                    **{f"val_{k}": v for k, v in val.items()}, "val_loss": val_loss,
                    "best_checkpoint": best, "epochs_run": st.epoch, "steps": st.step,
                    "skipped_steps": st.skipped, "stopped_early": st.stopped_early,
                    "img_per_s": float(np.median([float(v) for v in ips])) if ips else None,
                    "world_size": self.ctx.world,
                    "rank_param_checksums": checksums,
                    "ranks_consistent": len(set(checksums)) == 1,
                    "samples": {"train": len(self.data.train), "val": len(self.data.val), "test": len(self.data.test)},
                }
                if self.teacher is not None:
                    w.metrics["teacher_test_acc"] = self.teacher_acc
                if self.program is not None:  # the guard: each set before and after, which it judged by, the bound
                    f = self.cfg.finetune
                    w.metrics.update({**guarded, **{f"pretrained_{k}": v for k, v in st.baseline.items()},
                                      "general_lines": len(self.general.val),
                                      "max_general_drop": f.max_drop,
                                      "general_source": f.general or self.task.default_source,
                                      "guard_judged_by": self._guarded_by()})
                    if self.held_out is not None:
                        w.metrics.update({"held_out_lines": len(self.held_out), "held_out_source": f.held_out})
                w.extra = {"amp": {"requested": self.cfg.amp.level, "active": self.ctx.amp_active,
                                   "dtype": self.cfg.amp.dtype}, "format": "safetensors",
                           "deterministic": self.ctx.deterministic}
                if self.program is None:  # what reading the data changed, counted, and the notes said so
                    w.extra["data"] = {**self.data.counts, "notes": list(self.data.notes)}
                if self.init is not None:
                    w.extra["init"] = self.init  # the starting weights: path, sha256, what matched
        if self.ctx.world > 1:
            import paddle.distributed as dist

            dist.barrier()


@dataclass
class _State:
    step: int = 0
    epoch: int = 0
    batch: int = 0
    skipped: int = 0
    nonfinite_run: int = 0
    best_metric: float | None = None  # of metric_key: train.monitor, or the task's metric when that is val_loss
    best_loss: float | None = None
    bad_epochs: int = 0
    stopped_early: bool = False
    epoch_loss: float = float("nan")
    epoch_ips: float = 0.0
    step_rows: list[dict[str, Any]] = field(default_factory=list)
    epoch_rows: list[dict[str, Any]] = field(default_factory=list)
    baseline: dict[str, float] = field(default_factory=dict)  # an imported program's val_, general_ (held_out_) before training


class _Batches:
    """A loader of batches made in this thread: `collate` of each of the sampler's batches, as tensors."""

    def __init__(self, paddle: Any, sampler: Any, collate: Any):
        self.p, self.sampler, self.collate = paddle, sampler, collate

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for batch in self.sampler:
            feeds, y = self.collate(batch)
            yield _tensors(self.p, feeds), _tensors(self.p, y)


def _tensors(paddle: Any, t: Any) -> Any:
    """A task's numpy targets (an array or a dict of arrays) as paddle tensors."""
    if isinstance(t, dict):
        return {k: paddle.to_tensor(v) for k, v in t.items()}
    return paddle.to_tensor(t)


def _describe(tensors: Any) -> str:
    """Inputs of an interface in one line: `img [1, 8, 8], feat [4]`."""
    try:
        return ", ".join(f"{t['name']} {list(t['shape'][1:])}" for t in tensors)
    except (KeyError, TypeError):
        return repr(tensors)


def _fault_steps(var: str) -> set[int]:
    raw = os.environ.get(var, "")
    return {int(s) for s in raw.split(",") if s.strip()}
