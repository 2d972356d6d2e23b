"""Run configuration: one frozen dataclass per section, resolved as
defaults < `--config run.yaml` < `--set section.key=value` < explicit CLI flags.

    pipe train --config examples/digits.yaml --set train.lr=3e-3 --set train.epochs=5

Unknown keys and wrong types are `InputError`s naming the key and where it came from.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import InputError


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None, min: float | None = None,
         max: float | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices, "min": min, "max": max})


@dataclass(frozen=True)
class DataConfig:
    source: str = _opt("digits", "'digits', 'chinese_sentiment' or 'shapes' (detection) (built in), an ImageFolder "
                                 "or COCO directory, an .npz "
                                 "with x/y, a .tsv/.csv/.jsonl of texts and labels, or module:factory")
    image_size: int = _opt(0, "resize ImageFolder images to this square size; 0 keeps the source size (digits: 8)", min=0)
    channels: int = _opt(0, "1 (grayscale) or 3 (RGB) for ImageFolder data; 0 = 3")
    val_fraction: float = _opt(0.15, "fraction held out for validation when the source has no split")
    test_fraction: float = _opt(0.15, "fraction held out for test when the source has no split")
    split_seed: int = _opt(0, "seed of the stratified split when the source has no split")
    num_workers: int = _opt(0, "DataLoader worker processes per rank", min=0)
    persistent_workers: bool = _opt(False, "keep DataLoader workers alive across epochs")
    cache_dir: str = _opt("", "where decoded ImageFolder caches live; '' = $PIPE_CACHE_DIR or ~/.cache/pipe")
    shapes_images: int = _opt(2000, "shapes: training images generated (val and test: 15% as many each)", min=10)
    coco_train_json: str = _opt("", "detection: the train split's COCO annotation file, relative to data.source (or "
                                    "absolute), when the folder is in none of the layouts pipe knows; '' = find it")
    coco_train_images: str = _opt("", "detection: the folder data.coco_train_json's file_names are relative to")
    coco_val_json: str = _opt("", "detection: the val split's COCO annotation file ('' = carved out of train)")
    coco_val_images: str = _opt("", "detection: the folder data.coco_val_json's file_names are relative to")
    coco_test_json: str = _opt("", "detection: the test split's COCO annotation file ('' = carved out of train)")
    coco_test_images: str = _opt("", "detection: the folder data.coco_test_json's file_names are relative to")
    ocr_lines: int = _opt(1000, "ocr_lines (ocr_rec's and ocr_cls's built-in data) and ocr_lines_dotmatrix "
                                "(ocr_rec's): text lines generated for train (val and test: 15% as many each; ocr_cls "
                                "turns half of them by 180 degrees)", min=10)
    ocr_pages: int = _opt(100, "ocr_pages (ocr_det's built-in data): text pages generated for train (val and test: "
                               "15% as many each)", min=10)
    max_len: int = _opt(160, "text: characters kept per text (longer ones are truncated, shorter padded)", min=1)
    min_count: int = _opt(2, "text: a character enters the vocabulary if it occurs this often in train", min=1)
    text_column: str = _opt("text", "text files: the column (or JSON key) holding the text")
    label_column: str = _opt("label", "text files: the column (or JSON key) holding the label")
    text_inputs: str = _opt("ids", "text: the model's inputs made from the ids: 'ids' (one input x) or 'ernie' "
                                   "(input_ids and token_type_ids of one segment, for model ernie_tiny)",
                            ("ids", "ernie"))


@dataclass(frozen=True)
class ModelConfig:
    name: str = _opt("digits_cnn", "images: digits_cnn, mlp, resnet18, mobilenet_v3_small; text: text_fasttext, "
                                   "text_cnn, bigru, transformer, ernie_tiny (with data.text_inputs=ernie); or package.module:factory")
    init: str = _opt("", "fine-tune from these weights: a .pdparams or .safetensors state dict, a train artifact "
                         "directory, or a pipe import's export directory (an exported program: its own ops and "
                         "weights are trained, with the finetune section's guard) (--init); tensors matched by "
                         "name, one of another shape keeps its fresh init; '' = random init")
    init_strict: bool = _opt(False, "refuse (exit 2) a model.init with any missing, unexpected or differently "
                                    "shaped (or typed) tensor")
    task: str = _opt("classification", "what the model is trained, judged and served for: classification, detection "
                                        "(model centernet_tiny on a COCO data.source), or package.module:Task "
                                        "(pipeline/tasks/__init__.py)")
    logits_output: str = _opt("", "the output classification reads as logits, for a model returning several: a dict "
                                  "key, or output_<i> of a tuple; '' = the output named logits, or the only one")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = _opt(12, "total epochs; may be raised on resume", min=1)
    batch_size: int = _opt(64, "global batch size, split evenly across ranks", min=1)
    optimizer: str = _opt("adamw", "adamw or momentum (SGD with momentum)", ("adamw", "momentum"))
    lr: float = _opt(3e-3, "peak learning rate", min=0)
    momentum: float = _opt(0.9, "momentum for optimizer=momentum")
    weight_decay: float = _opt(1e-4, "weight decay (decoupled for AdamW, L2 for momentum)", min=0)
    schedule: str = _opt("cosine", "cosine, step or constant, after the warm-up", ("cosine", "step", "constant"))
    warmup_epochs: float = _opt(1.0, "linear warm-up length in epochs (0 = none)", min=0)
    step_epochs: int = _opt(10, "schedule=step: multiply the LR by gamma every this many epochs", min=1)
    gamma: float = _opt(0.1, "schedule=step: LR decay factor")
    grad_clip_norm: float = _opt(0.0, "clip gradients to this global norm; 0 = off", min=0)
    label_smoothing: float = _opt(0.0, "label smoothing of the cross-entropy loss", min=0)
    seed: int = _opt(0, "seed for parameters, data order and dropout")
    deterministic: bool = _opt(False, "set Paddle's deterministic-kernel flags this build has (cuDNN, embedding on GPU; "
                                      "sorted gradient sums); the manifest records what was set and what was not")
    monitor: str = _opt("", "what picks the best checkpoint and counts for patience: val_<metric> of the task (a tie "
                            "goes to the lower val_loss; classification: val_acc, detection: val_map) or val_loss (a "
                            "tie goes to the task's metric); '' = the task's own (val_acc, val_map)")
    patience: int = _opt(0, "stop after this many epochs without a better train.monitor; 0 = off", min=0)
    checkpoint_every: int = _opt(0, "also checkpoint every N optimizer steps; 0 = at epoch ends only", min=0)
    keep_last: int = _opt(3, "checkpoints kept besides the best one", min=1)
    log_interval: int = _opt(10, "steps between progress updates", min=1)
    max_nonfinite_steps: int = _opt(5, "abort (exit 3) after this many consecutive NaN/Inf losses", min=1)


@dataclass(frozen=True)
class AmpConfig:
    level: str = _opt("O0", "O0 (off), O1 or O2 mixed precision", ("O0", "O1", "O2"))
    dtype: str = _opt("float16", "float16 or bfloat16", ("float16", "bfloat16"))
    init_loss_scaling: float = _opt(65536.0, "GradScaler initial loss scale (pinned: defaults drifted across releases)")
    incr_ratio: float = _opt(2.0, "GradScaler scale increase factor")
    decr_ratio: float = _opt(0.5, "GradScaler scale decrease factor")
    incr_every_n_steps: int = _opt(2000, "GradScaler: finite steps before the scale increases")
    decr_every_n_nan_or_inf: int = _opt(1, "GradScaler: non-finite steps before the scale decreases")
    use_dynamic_loss_scaling: bool = _opt(True, "GradScaler: adapt the scale")


@dataclass(frozen=True)
class DistConfig:
    nproc_per_node: int = _opt(1, "worker processes on this node (CPU: gloo); 1 runs in-process", min=1)
    gpus: str = _opt("", "comma-separated GPU ids, e.g. 0,1,2,3 (NCCL); '' = CPU")
    nnodes: int = _opt(1, "number of nodes; >1 needs master", min=1)
    master: str = _opt("", "HOST:PORT of the rendezvous for multi-node runs")
    node_rank: int = _opt(-1, "this node's rank; -1 lets arrival order decide")
    peer_timeout: int = _opt(600, "seconds to wait for the whole job before giving up (the launcher has no peer timeout)", min=1)


@dataclass(frozen=True)
class ExportConfig:
    parity_tol: float = _opt(1e-4, "max |diff| allowed, relative to max |logit|, predictor vs trained model")
    parity_samples: int = _opt(64, "held-out samples checked for parity", min=1)
    precision: str = _opt("fp32", "bf16 also measures oneDNN bf16 inference (avx512_bf16 CPUs; fp16 on a GPU): "
                                  "accuracy and top-1 agreement vs fp32 in the manifest (--precision)", ("fp32", "bf16"))


@dataclass(frozen=True)
class DistillConfig:
    teacher: str = _opt("", "a train artifact directory whose model teaches this one; '' = no distillation")
    temperature: float = _opt(4.0, "softmax temperature T of the KL term (scaled by T^2)", min=0.01)
    alpha: float = _opt(0.5, "weight of the KL term; the cross-entropy gets 1 - alpha", min=0, max=1)
    engine: str = _opt("paddleslim", "paddleslim: PaddleSlim's Distill (convert_fn=False) on the models' logit "
                                     "layers plus `pairs`; plain: pipe's own KL on the outputs (logits only)",
                       ("paddleslim", "plain"))
    pairs: str = _opt("", "intermediate-feature pairs for engine=paddleslim, 'student_layer=teacher_layer,...' "
                          "(sublayer names as in named_sublayers(); same output shape), L2 loss; '' = logits only")
    feature_weight: float = _opt(1.0, "weight of each intermediate-feature L2 term", min=0)


@dataclass(frozen=True)
class CompressConfig:
    int8: bool = _opt(False, "post-training int8 quantization of the export (--int8)")
    backend: str = _opt("both", "int8 engine: paddle (PaddleSlim + oneDNN int8), onnxruntime, or both; openvino: only "
                                "OpenVINO's own route (NNCF with a per-layer search: ocr_rec models)",
                        ("paddle", "onnxruntime", "both", "openvino"))
    algo: str = _opt("avg", "activation calibration (PaddleSlim's names); onnxruntime uses its closest method",
                     ("avg", "KL", "hist", "mse"))
    calib_batches: int = _opt(0, "calibration batches, drawn from the train split; 0 = up to 10 whole batches, all of "
                                 "a smaller train split (a number the split cannot fill is an error)", min=0)
    calib_batch_size: int = _opt(32, "samples per calibration batch", min=1)
    calib_seed: int = _opt(0, "seed of the draw of calibration samples from the train split")
    max_drop: float = _opt(1.0, "gate: exit 4 if the best int8 variant's test accuracy is more than this many "
                                "points below fp32", min=0)
    min_agreement: float = _opt(0.99, "an int8 (or any) variant whose top-1 agreement with fp32, over up to 4,096 samples "
                                      "of all splits, is below this is never shipped; compress exits 4 if no int8 "
                                      "variant reaches it",
                                min=0, max=1)
    # 20 dB = noise power 1% of the signal (cosine ~0.995). Measured: int8 within the agreement budget gave
    # 30-39 dB on every float output (examples/two_inputs int8-onnx embedding 34.6-38.6 dB with every algo;
    # ERNIE-shaped and two-input models 30 dB, facts note section 14), broken int8 11-16 dB (oneDNN int8 fc on
    # two_inputs, agreement 0.979-0.987) down to 1.4 dB (onnxruntime's default op types on attention).
    min_sqnr_db: float = _opt(20.0, "a variant whose SQNR against fp32 (10 log10(sum ref^2 / sum (ref - got)^2), over "
                                    "the agreement samples) is below this on any float output other than the logits "
                                    "is never shipped; compress exits 4 if no int8 variant reaches it")
    reduce_range: bool = _opt(True, "onnxruntime int8 with 7-bit weights: the same numbers on every x86 CPU; false = "
                                    "8-bit weights, exact only with VNNI (elsewhere loaded with "
                                    "session.x64quantprecision=1, at about fp32 speed)")
    openvino: bool = _opt(True, "also measure OpenVINO: fp32 on the export's legacy program (or the fp32 ONNX) and "
                                "int8 on the int8 ONNX; unsupported, with the reason, where it cannot run them")
    latency_runs: int = _opt(200, "timed batch-1 runs per variant after warm-up, interleaved across variants", min=1)
    throughput_runs: int = _opt(30, "timed throughput-batch runs per variant after warm-up, interleaved (batch 32; "
                                    "a task's own timing_batch: ocr_det 4 pages)", min=1)
    distill: bool = _opt(False, "train `student` from the export's model (knowledge distillation), export it, "
                                "and compress the student (--distill)")
    student: str = _opt("", "the student model for --distill: a built-in name or module:factory")
    baseline: bool = _opt(False, "--distill: also train the student without the teacher, to measure the gain")


@dataclass(frozen=True)
class ReleaseConfig:
    pick: str = _opt("fastest", "`pipe all`: what to package among the variants compress measured on every engine "
                                "within compress.max_drop of fp32: fastest, smallest, or fp32", ("fastest", "smallest", "fp32"))
    engine: str = _opt("auto", "`pipe all`: the engine to package on: auto (any measured), paddle, onnxruntime or openvino "
                               "(without a compress stage: the export's files on it; auto = paddle)",
                       ("auto", "paddle", "onnxruntime", "openvino"))
    optimize: str = _opt("balanced", "`pipe all`: which speed `fastest` means: balanced (batch 1 and batch 32), latency "
                                     "(batch 1 p50) or throughput (batch 32 items/s)", ("balanced", "latency", "throughput"))
    min_accuracy: float = _opt(0.0, "`pipe all`: exit 4 unless the packaged model's test accuracy is at least this "
                                    "(0-1; another task: its monitored metric, e.g. detection's mAP, at most this "
                                    "for a lower-is-better one); 0 = off", min=0, max=1)


@dataclass(frozen=True)
class ImportConfig:
    """`pipe import` (the `import:` section; `pipe all` runs it in place of train and export when `source`
    is set): someone else's exported model as this chain's export artifact."""

    source: str = _opt("", "an exported Paddle model: a directory with one <prefix>.pdmodel or <prefix>.json and its "
                           "<prefix>.pdiparams (PaddleOCR, PaddleX), or the program file; '' = none (pipe all trains)")
    task: str = _opt("", "what the model is: ocr_rec, ocr_det or ocr_cls (text-line orientation); '' = the task "
                         "inference.yml names (PostProcess: CTCLabelDecode is ocr_rec, DBPostProcess ocr_det, "
                         "ClsPostProcess ocr_cls)")
    keys: str = _opt("", "ocr_rec: the character key file (PaddleOCR's character_dict_path, one character a line); "
                         "'' = inference.yml's character_dict")
    nfkc: bool = _opt(False, "ocr_rec: compare texts after Unicode NFKC normalisation, so a full-width form matches "
                             "its ASCII one (，= , ～= ~ （= (: the keys hold both, most fonts draw them alike), in the "
                             "recognizer's metrics and agreements at every stage and in an OCR system's e2e_acc; off "
                             "= as PaddleOCR's RecMetric")
    onnx: bool = _opt(True, "also convert to model.onnx (paddle2onnx, repaired) held to import.parity_tol")
    parity_tol: float = _opt(1e-2, "max |diff| allowed, relative to each output's max |value|, of the PIR program and "
                                   "the ONNX file against the source program (PP-OCRv4 rec's softmax, 64 lines: up to "
                                   "4.0e-4 PIR, 4.7e-3 ONNX, every decoded text the same; translation changes kernels)",
                             min=0)
    parity_samples: int = _opt(64, "test samples the parity gate runs, in the task's batches", min=1)
    batch_size: int = _opt(8, "lines per batch when measuring the imported model (the task batches by width)", min=1)


@dataclass(frozen=True)
class PostprocessConfig:
    score_threshold: float = _opt(0.05, "detection: boxes scoring below this are not answered", min=0, max=1)
    nms_iou: float = _opt(0.6, "detection: of two boxes of one class overlapping more than this IoU the lower-scoring "
                               "one goes (class-wise NMS)", min=0, max=1)
    max_detections: int = _opt(100, "detection: at most this many boxes per image", min=1)


@dataclass(frozen=True)
class SystemConfig:
    """`pipe all` of an OCR system (the `system:` section): each part's own config run as its own chain in
    RUN/<det|cls|rec>, the three packages then composed into RUN/ocr_system (`pipe package DET CLS REC`)."""

    det: str = _opt("", "an OCR system's text detector: a pipe config (an ocr_det import); '' = not a system")
    cls: str = _opt("", "an OCR system's text-line orientation classifier: a pipe config (an ocr_cls import); '' = none")
    rec: str = _opt("", "an OCR system's recognizer: a pipe config (an ocr_rec import)")
    drop_score: float = _opt(0.5, "an OCR system: drop a line whose recognition score is below this", min=0, max=1)


@dataclass(frozen=True)
class FinetuneConfig:
    """Fine-tuning an imported pretrained program (`model.init` a pipe import's export directory): the guard
    against forgetting (docs/finetune.md says how each default was chosen)."""

    lr: float = _opt(2e-4, "peak learning rate from an imported program (train.lr is for pipe's own models: a "
                           "pretrained start wants a smaller step)", min=0)
    general: str = _opt("", "the pretrained model's own domain, rehearsed: a data source of the task whose train "
                            "split finetune.mix draws from; '' = its built-in lines (ocr_lines)")
    general_lines: int = _opt(150, "lines of finetune.general's val split, reported every epoch (how well the model "
                                   "keeps its rehearsal set); its train split is 1/0.15 as many", min=10)
    held_out: str = _opt("ocr_lines_scan", "what the guard judges forgetting by: a data source of the task in a style "
                                           "rehearsal never draws (the built-in ocr_lines_scan: another font, paper "
                                           "and degradation), or your own labelled lines; '' = judge by "
                                           "finetune.general's val lines instead")
    held_out_lines: int = _opt(150, "lines of finetune.held_out evaluated every epoch (its val split)", min=10)
    mix: float = _opt(0.5, "share of every training batch drawn from finetune.general's train lines (rehearsal)",
                      min=0, max=0.9)
    max_drop: float = _opt(0.01, "the best checkpoint is the best by train.monitor among epochs whose metric on "
                                 "finetune.held_out (or finetune.general, when held_out is '') is within this of "
                                 "the pretrained model's (0.01 = 1 point); no such epoch fails the run (exit 4)",
                           min=0, max=1)
    augment: bool = _opt(True, "augment training lines (rotation, perspective, blur, noise, colour, margins), "
                               "seeded by train.seed")
    l2sp: float = _opt(0.0, "L2-SP (Li et al., 2018): add l2sp/2 times the squared distance of the trainable weights "
                            "from the pretrained ones to the loss, pulling them back; 0 = off", min=0)
    freeze_early: float = _opt(0.0, "share of the program's trainable tensors, counted in the order the program "
                                    "reads them (the backbone's early blocks first), kept frozen; 0 = none",
                               min=0, max=1)


@dataclass(frozen=True)
class PredictSection:
    """`pipe all` ends with `pipe predict` of the package it made over `predict.inputs` into RUN/predict (the
    `predict:` section; docs/predict.md)."""

    inputs: str = _opt("", "`pipe all`: a file, folder, glob or @list.txt to run the released package over at the end "
                           "(RUN/predict: predictions.jsonl, errors.jsonl, summary.json); '' = no predict step")
    dpi: float = _opt(144.0, "`pipe all`'s predict step: PDF pages are rendered at this resolution", min=1, max=1200)
    field: str = _opt("text", "`pipe all`'s predict step, text packages: the .jsonl member or .tsv column of the text")
    draw: bool = _opt(False, "`pipe all`'s predict step: also draw each image's boxes into RUN/predict/draw/")


@dataclass(frozen=True)
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    compress: CompressConfig = field(default_factory=CompressConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    release: ReleaseConfig = field(default_factory=ReleaseConfig)
    postprocess: PostprocessConfig = field(default_factory=PostprocessConfig)
    import_: ImportConfig = field(default_factory=ImportConfig)  # `import:` in YAML, --set and manifests
    system: SystemConfig = field(default_factory=SystemConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    predict: PredictSection = field(default_factory=PredictSection)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {_SECTION_OF.get(k, k): v for k, v in dataclasses.asdict(self).items()}


# A section whose name is a Python keyword is a field with a trailing underscore.
_SECTION_OF = {"import_": "import"}
_FIELD_OF = {v: k for k, v in _SECTION_OF.items()}
_SECTIONS: dict[str, type] = {_SECTION_OF.get(k, k): v for k, v in typing.get_type_hints(RunConfig).items()}


def _run_config(values: dict[str, dict[str, Any]]) -> RunConfig:
    return RunConfig(**{_FIELD_OF.get(s, s): _SECTIONS[s](**values.get(s, {})) for s in _SECTIONS})


def _all_keys() -> list[str]:
    return [f"{s}.{f.name}" for s, cls in _SECTIONS.items() for f in dataclasses.fields(cls)]


def _unknown(key: str, where: str) -> InputError:
    close = difflib.get_close_matches(key, _all_keys(), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return InputError(f"{where}{key}: unknown key{hint}")


def _coerce(key: str, value: Any, typ: Any, where: str) -> Any:
    """Check `value` against the field type; YAML scalars like 3e-4 arrive as str and are parsed."""
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            if not math.isfinite(number):  # an lr of NaN or a tolerance of inf is never meant
                raise InputError(f"{where}{key}: must be a finite number, got {value!r}")
            return number
    elif typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. gpus: 0 or data.source: 123 in YAML
    else:  # pragma: no cover - only the types above are used
        raise TypeError(typ)
    name = getattr(typ, "__name__", str(typ))
    raise InputError(f"{where}{key}: expected {name}, got {type(value).__name__} {value!r}")


def _apply(values: dict[str, dict[str, Any]], key: str, raw: Any, where: str) -> None:
    section, _, name = key.partition(".")
    cls = _SECTIONS.get(section)
    if cls is None or not name:
        raise _unknown(key, where)
    hints = typing.get_type_hints(cls)
    if name not in hints:
        raise _unknown(key, where)
    spec = {f.name: f for f in dataclasses.fields(cls)}[name]
    value = _coerce(key, raw, hints[name], where)
    choices = spec.metadata.get("choices")
    if choices and value not in choices:
        raise InputError(f"{where}{key}: must be one of {', '.join(choices)}, got {value!r}")
    low = spec.metadata.get("min")
    if low is not None and value < low:
        raise InputError(f"{where}{key}: must be >= {low}, got {value!r}")
    high = spec.metadata.get("max")
    if high is not None and value > high:
        raise InputError(f"{where}{key}: must be <= {high}, got {value!r}")
    values.setdefault(section, {})[name] = value


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: config file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read config ({e.__class__.__name__})") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}: invalid YAML{at}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise InputError(f"{path}: expected a mapping of sections (data, model, train, ...)")
    return doc


def load(
    path: Path | None = None,
    sets: typing.Sequence[str] = (),
    flags: dict[str, tuple[str, Any]] | None = None,
) -> RunConfig:
    """Resolve the run configuration. `flags` maps dotted keys to (flag name, value); None = not given."""
    values: dict[str, dict[str, Any]] = {}
    if path is not None:
        for section, body in _read_yaml(path).items():
            if body is None and section in _SECTIONS:
                continue  # a section whose keys are all commented out
            if not isinstance(body, dict):
                if section in _SECTIONS:
                    raise InputError(f"{path}: {section}: expected a mapping of keys")
                raise _unknown(str(section), f"{path}: ")
            for name, raw in body.items():
                _apply(values, f"{section}.{name}", raw, f"{path}: ")
    for item in sets:
        key, eq, text = item.partition("=")
        if not eq:
            raise InputError(f"--set {item}: expected section.key=value")
        try:
            raw = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            raw = text
        _apply(values, key.strip(), raw, "--set ")
    for key, (flag, raw) in (flags or {}).items():
        if raw is not None:
            try:
                _apply(values, key, raw, "")
            except InputError as e:
                raise InputError(f"{flag}: {str(e).partition(': ')[2]}") from None
    return _run_config(values)


def from_dict(doc: dict[str, Any]) -> RunConfig:
    """Rebuild a RunConfig recorded in a manifest (strict: same checks as YAML)."""
    values: dict[str, dict[str, Any]] = {}
    for section, body in doc.items():
        for name, raw in (body or {}).items():
            _apply(values, f"{section}.{name}", raw, "manifest config: ")
    return _run_config(values)


def describe() -> list[tuple[str, Any, str]]:
    """(key, default, help) for every key: used by `pipe train --help` style listings and docs."""
    out = []
    for section, cls in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else None
            out.append((f"{section}.{f.name}", default, f.metadata.get("help", "")))
    return out

