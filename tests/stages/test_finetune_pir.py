"""`pipe train --init` of an import of a PIR program (PaddleOCR 3.x / PaddleX 3's inference.json; issue 49): PP-OCRv4
rec converted to PIR fine-tunes as its legacy import does, to the bit (the same ops, read from the JSON), and exports
back into a PIR params file beside the untouched program, through pipe import's path; a tampered import is refused
in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline import artifacts, runtime
from pipeline.nets import paddle_program, program_layer
from tests.conftest import REPO

PIPE = [sys.executable, "-m", "pipeline.cli"]
pytestmark = [pytest.mark.slow(reason="fine-tunes the real PP-OCRv4 recognizer twice"), pytest.mark.timeout(1800)]
# the example, cut to 5 steps of 8 lines on one process (the guard off: not under test here)
SHORT = ["--config", str(REPO / "examples/ppocr_finetune.yaml"), "--nproc", "1", "--epochs", "1",
         "--set", "data.ocr_lines=20", "--set", "finetune.general_lines=10", "--set", "train.batch_size=8",
         "--set", "finetune.max_drop=1"]


def _train(init: Path, run: Path) -> Path:
    done = subprocess.run([*PIPE, "train", *SHORT, "--init", str(init), "--run", str(run)], capture_output=True,
                          text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return run / "train"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, ppocr_rec_export, ppocr_rec_pir_export) -> dict[str, Path]:
    """The same fine-tune (lines, seed, config) from the legacy import and from the PIR one."""
    root = tmp_path_factory.mktemp("finetune-pir")
    return {"legacy": _train(ppocr_rec_export, root / "legacy"), "pir": _train(ppocr_rec_pir_export, root / "pir")}


def test_the_pir_import_fine_tunes_as_the_legacy_one(tuned, ppocr_rec_pir_export):
    legacy, pir = (artifacts.verify(tuned[k], ("train",)).manifest for k in ("legacy", "pir"))
    assert pir["init"]["kind"] == "program" and pir["init"]["path"] == str(ppocr_rec_pir_export.resolve())
    assert pir["init"]["source"]["format"] == "pir" and legacy["init"]["source"]["format"] == "legacy"
    assert pir["init"]["loaded"] == legacy["init"]["loaded"] == 234
    steps = (tuned["pir"] / "steps.csv").read_text()
    assert len(steps.splitlines()) == 1 + 5
    # the same loss curve to the bit, and the same weights: the JSON's ops are the legacy program's ops
    assert steps == (tuned["legacy"] / "steps.csv").read_text()
    assert (tuned["pir"] / "model.safetensors").read_bytes() == (tuned["legacy"] / "model.safetensors").read_bytes()
    assert pir["metrics"]["test_acc"] == legacy["metrics"]["test_acc"]


def test_the_pir_fine_tune_exports_as_an_import_does(tuned, ppocr_rec_pir_export, cli):
    code, _, err = cli("export", tuned["pir"], "--onnx")  # the import had none; --onnx asks for it
    assert code == 0, err
    out = tuned["pir"].parent / "export"
    m = artifacts.verify(out, ("export",)).manifest
    # no legacy program: none invented; the ONNX converted from the PIR program, parity-gated as at import
    assert set(m["files"]) == {"model.json", "model.pdiparams", "model.onnx", "keys.txt"}
    assert m["metrics"]["onnx_parity_rel"] <= m["metrics"]["parity_tol"]
    assert m["metrics"]["onnx_parity_text_agreement"] == 1.0
    assert m["source"]["kind"] == "finetune" and m["legacy"]["available"] is False
    assert m["source"]["pretrained"]["manifest_sha256"] == artifacts.verify(ppocr_rec_pir_export, ("export",)).manifest_sha256
    imp = ppocr_rec_pir_export
    assert (out / "model.json").read_bytes() == (imp / "model.json").read_bytes()  # the program, untouched
    # the params file holds the trained weights, every tensor where the program reads it
    prog = paddle_program.Program(out / "model.json", out / "model.pdiparams")
    written = program_layer.read_params(prog, paddle_program.read(prog))
    trained = runtime.load_safetensors(runtime.import_paddle(1), tuned["pir"] / "model.safetensors")
    assert {program_layer.key(n) for n in written} == set(trained)
    assert all((written[n] == np.asarray(trained[program_layer.key(n)])).all() for n in written)
    assert (out / "model.pdiparams").read_bytes() != (imp / "model.pdiparams").read_bytes()
    train = artifacts.verify(tuned["pir"], ("train",)).manifest
    assert m["metrics"]["test_acc"] == pytest.approx(train["metrics"]["test_acc"], abs=1 / 3 + 1e-9)
    assert m["metrics"]["parity_text_agreement"] == 1.0


def test_a_tampered_pir_import_is_refused_in_one_line(ppocr_rec_pir_export, tmp_path, cli):
    import shutil

    imp = tmp_path / "import"
    shutil.copytree(ppocr_rec_pir_export, imp)
    data = bytearray((imp / "model.pdiparams").read_bytes())
    data[-1] ^= 0x01  # one weight's last byte
    (imp / "model.pdiparams").write_bytes(bytes(data))
    run = tmp_path / "run"
    code, _, err = cli("train", *SHORT, "--init", imp, "--run", run)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "model.pdiparams" in err and "sha256" in err
    assert not run.exists()


def test_the_bench_rows_compare_the_two_runs(tuned, tmp_path):
    import shutil

    from pipeline.bench import ocr_finetune

    speed, same = ocr_finetune.pir_rows(tuned["pir"], tuned["legacy"])
    m = artifacts.verify(tuned["pir"], ("train",)).manifest["metrics"]
    assert speed[0] == "fine-tune PP-OCRv4 rec from its PIR program (inference.json, 1 process, 5 steps): seconds " \
                       "per step, PIR / legacy"
    assert speed[1].startswith(f"{8 / m['img_per_s']:.2f} / ")
    assert same[1].startswith("0; ") and same[3] == "met"  # the same losses to the bit
    off = tmp_path / "off"  # a run whose third step's loss moved by 1e-3: beyond noise
    off.mkdir()
    shutil.copyfile(tuned["pir"] / "manifest.json", off / "manifest.json")
    rows = (tuned["pir"] / "steps.csv").read_text().splitlines()
    step, epoch, loss, lr = rows[3].split(",")
    rows[3] = ",".join((step, epoch, repr(float(loss) + 1e-3), lr))
    (off / "steps.csv").write_text("\n".join(rows) + "\n")
    assert ocr_finetune.pir_rows(off, tuned["legacy"])[1][3] == "**missed**"
