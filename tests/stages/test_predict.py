"""`pipe predict` on the session's digits package (a real, tiny classifier; real PNG files and PDFs made here):
each row's answer equals what /v1/predict answers for the same file (serve's own request path, without HTTP);
folders, globs and @lists; the exact error rows for a corrupt, an empty, a huge-claim and a missing image and a
damaged or encrypted PDF; exit codes 0 / 5 / 2; a rerun skips everything, a torn last line is cut and redone;
another package's or settings' DIR, a tampered package and an empty input set are refused in one line with
nothing written; no process is left behind. The SIGKILL test (a real `pipe predict` process killed at random
moments, then resumed) is in test_predict_kill.py; the OCR system's in test_predict_ocr.py."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from pipeline.predict import output
from tests.conftest import main_in_fresh_process, tree_hash
from tests.serving_helpers import packaged_run

N_IMAGES = 12
pytestmark = pytest.mark.slow(reason="each run starts predictor processes (~10-25 s on this shared machine)")


@pytest.fixture(scope="module")
def package(trained_digits, tmp_path_factory) -> Path:
    return packaged_run(trained_digits, tmp_path_factory.mktemp("predict")) / "package"


def _png(image: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, "PNG")
    return buf.getvalue()


def _images(folder: Path, n: int = N_IMAGES, seed: int = 0) -> list[Path]:
    """n small grey PNGs of several sizes (the package resizes them to 8x8), half in a subfolder."""
    rng = np.random.RandomState(seed)
    (folder / "sub").mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        side = 8 + 4 * (i % 3)
        p = folder / ("sub" if i % 2 else "") / f"img{seed}_{i:02d}.png"
        p.write_bytes(_png((rng.rand(side, side) * 255).astype(np.uint8)))
        paths.append(p)
    return paths


def huge_claim_png() -> bytes:
    """A valid-looking PNG of a few bytes whose header claims 50,000 x 50,000 pixels."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 50000, 50000, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def encrypted_pdf() -> bytes:
    """A one-page PDF encrypted with the standard security handler (RC4 40-bit, revision 2; PDF 1.7 spec
    algorithms 2-4) under the user password "secret": a reader without it must refuse to open it."""
    from Crypto.Cipher import ARC4
    from Crypto.Hash import MD5

    pad = bytes.fromhex("28BF4E5E4E758A4164004E56FFFA01082E2E00B6D0683E802F0CA9FE6453697A")
    padded = lambda pw: (pw + pad)[:32]  # noqa: E731
    owner = ARC4.new(MD5.new(padded(b"owner")).digest()[:5]).encrypt(padded(b"secret"))
    doc_id, perms = b"0123456789abcdef", -44
    key = MD5.new(padded(b"secret") + owner + struct.pack("<i", perms) + doc_id).digest()[:5]
    user = ARC4.new(key).encrypt(pad)
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 200 200] >>",
            b"<< /Filter /Standard /V 1 /R 2 /O <" + owner.hex().encode() + b"> /U <" + user.hex().encode()
            + b"> /P " + str(perms).encode() + b" >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1) + b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += (b"trailer\n<< /Size %d /Root 1 0 R /Encrypt 4 0 R /ID [<%s> <%s>] >>\nstartxref\n%d\n%%%%EOF\n"
            % (len(objs) + 1, doc_id.hex().encode(), doc_id.hex().encode(), xref))
    return bytes(out)


def make_pdf(path: Path, pages: int = 3) -> Path:
    """A PDF of `pages` pages drawn here (PIL's PDF writer), each a different grey pattern."""
    from PIL import Image

    ims = [Image.fromarray(np.full((96, 72), 40 + 60 * i, np.uint8)).convert("RGB") for i in range(pages)]
    ims[0].save(path, "PDF", save_all=True, append_images=ims[1:], resolution=72.0)
    return path


def v1_answers(package: Path, raws: list[bytes]) -> list[dict]:
    """What /v1/predict answers for each file sent alone as {"images": [base64]}."""
    return v1_bodies(package, [{"images": [base64.b64encode(raw).decode()]} for raw in raws])


def v1_bodies(package: Path, bodies: list[dict]) -> list[dict]:
    """What /v1/predict answers for each body: serve's own request path (`validate.v1_request`, a predictor process
    on the package's engine, `validate.v1_answer`) without HTTP, through JSON as a client reads it."""
    from pipeline.serving import spec as spec_mod, validate
    from pipeline.serving.predictor import start_predictors
    from stages.serve import ServeConfig

    spec = spec_mod.load_package(package)
    s = spec_mod.settings(ServeConfig(), spec)
    (pred,) = start_predictors(spec, 1, 1, s.max_batch_size)
    try:
        out = []
        for body in bodies:
            feeds, sizes = asyncio.run(validate.v1_request(body, spec, s))
            out.append(json.loads(json.dumps(validate.v1_answer(pred.run(feeds), spec, sizes))))
        return out
    finally:
        pred.close()


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_rows_are_v1_answers_and_a_rerun_skips_them(package, tmp_path, cli):
    paths = _images(tmp_path / "in")
    out = tmp_path / "out"
    code, stdout, err = cli("predict", package, tmp_path / "in", "--out", out, "--workers", "2", "--batch", "4")
    assert code == 0, err
    got = rows(out / output.PREDICTIONS)
    assert sorted(r["source"] for r in got) == sorted(str(p) for p in paths)  # the subfolder too, each once
    want = dict(zip(map(str, paths), v1_answers(package, [p.read_bytes() for p in paths]), strict=True))
    for r in got:
        assert r["page"] is None and r["sha256"] == hashlib.sha256(Path(r["source"]).read_bytes()).hexdigest()
        assert r["answer"] == want[r["source"]]
    assert not (out / output.ERRORS).read_text()
    s = json.loads((out / output.SUMMARY).read_text())
    assert (s["items"], s["done"], s["skipped"], s["failed"]) == (N_IMAGES, N_IMAGES, 0, 0)
    assert s["workers"] == 2 and s["batch"] == 4 and s["task"] == "classification"
    assert s["engine"] == "paddle_inference" and s["precision"] == "fp32" and s["items_per_s"] > 0
    assert s["package_sha256"] == json.loads((out / output.FINGERPRINT).read_text())["package_sha256"]
    assert f"{N_IMAGES} done" in stdout
    # the same run again: nothing to do, nothing written; a new file (and a glob, a list naming old ones): only it
    before = (out / output.PREDICTIONS).read_bytes()
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out)
    assert code == 0, err
    assert (out / output.PREDICTIONS).read_bytes() == before
    s = json.loads((out / output.SUMMARY).read_text())
    assert (s["items"], s["done"], s["skipped"]) == (N_IMAGES, 0, N_IMAGES)
    (new,) = _images(tmp_path / "more", n=1, seed=7)
    listing = tmp_path / "list.txt"
    listing.write_text(f"# two old files and a new one\n{paths[0]}\n\n{paths[1]}\n{new.relative_to(tmp_path)}\n")
    code, _, err = cli("predict", package, f"@{listing}", str(tmp_path / "in" / "*.png"), "--out", out)
    assert code == 0, err
    got = rows(out / output.PREDICTIONS)
    assert len(got) == N_IMAGES + 1 and got[-1]["source"] == str(new)
    assert len({(r["source"], r["sha256"]) for r in got}) == len(got)


def test_bad_items_become_error_rows_and_exit_5(package, tmp_path):
    """Corrupt, zero-byte, huge-claim, a damaged and an encrypted PDF, a listed file that is not there: one error row
    each, the good items done, exit 5 with one line; run in a fresh process that reports its children left."""
    good = _images(tmp_path / "in", n=3)
    bad = {"corrupt.png": b"\x89PNG\r\n\x1a\nnot really a png", "zero.png": b"", "huge.png": huge_claim_png(),
           "damaged.pdf": b"%PDF-1.4\n1 0 obj << /Type /Catalog", "encrypted.pdf": encrypted_pdf(),
           "text.jpg": b"just some text"}
    for name, raw in bad.items():
        (tmp_path / "in" / name).write_bytes(raw)
    listing = tmp_path / "list.txt"
    listing.write_text(str(tmp_path / "gone.png") + "\n")
    out = tmp_path / "out"
    code, err, left = main_in_fresh_process("predict", package, tmp_path / "in", f"@{listing}", "--out", out,
                                            "--workers", "1")
    assert code == 5, err
    assert left == []  # no predictor process outlives the job
    assert err.strip().splitlines()[-1] == (f"pipe predict: 7 of 10 items failed; see {out / output.ERRORS}")
    assert "Traceback" not in err
    errors = {Path(r["source"]).name: r["error"] for r in rows(out / output.ERRORS)}
    assert errors == {
        "corrupt.png": "not a decodable PNG/JPEG",
        "zero.png": "an empty file (0 bytes)",
        "huge.png": "its header claims 50000 x 50000 pixels, more than the package's limit of 16777216",
        "damaged.pdf": errors["damaged.pdf"],
        "encrypted.pdf": "not a readable PDF (encrypted: it needs a password)",
        "text.jpg": "not a decodable PNG/JPEG",
        "gone.png": "no such file"}
    assert errors["damaged.pdf"].startswith("not a readable PDF (")
    assert sorted(r["source"] for r in rows(out / output.PREDICTIONS)) == sorted(map(str, good))
    # a rerun does not retry them (they are written), and still says the job has failed items
    code, err, left = main_in_fresh_process("predict", package, tmp_path / "in", f"@{listing}", "--out", out)
    assert code == 5 and left == [], err
    s = json.loads((out / output.SUMMARY).read_text())
    assert (s["done"], s["skipped"], s["failed"], s["previously_failed"]) == (0, 10, 0, 7)


def test_pdf_pages_are_rendered_and_answered_as_their_png(package, tmp_path, cli):
    import pypdfium2 as pdfium

    pdf = make_pdf(tmp_path / "doc.pdf", pages=3)
    out = tmp_path / "out"
    code, _, err = cli("predict", package, pdf, "--out", out, "--dpi", "72")
    assert code == 0, err
    got = rows(out / output.PREDICTIONS)
    digest = hashlib.sha256(pdf.read_bytes()).hexdigest()
    assert [(r["source"], r["page"], r["sha256"]) for r in got] == [(str(pdf), p, digest) for p in (1, 2, 3)]
    doc = pdfium.PdfDocument(str(pdf))
    pages = [_png(np.asarray(doc[i].render(scale=1.0).to_pil().convert("RGB"))) for i in range(3)]
    doc.close()
    assert [r["answer"] for r in got] == v1_answers(package, pages)
    assert len({json.dumps(r["answer"]) for r in got}) == 3  # three different pages, three answers


def test_torn_last_line_is_cut_and_redone_once(package, tmp_path, cli):
    _images(tmp_path / "in", n=4)
    out = tmp_path / "out"
    assert cli("predict", package, tmp_path / "in", "--out", out)[0] == 0
    whole = (out / output.PREDICTIONS).read_bytes()
    lines = whole.splitlines(keepends=True)
    (out / output.PREDICTIONS).write_bytes(b"".join(lines[:-1]) + lines[-1][:25])  # a kill mid-write
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out)
    assert code == 0, err
    got = rows(out / output.PREDICTIONS)
    assert len(got) == 4 and len({r["source"] for r in got}) == 4
    assert got[-1]["source"] == json.loads(lines[-1])["source"]
    assert json.loads((out / output.SUMMARY).read_text())["done"] == 1


def test_refusals_are_one_line_and_write_nothing(package, tmp_path, cli):
    _images(tmp_path / "in", n=2)
    out = tmp_path / "out"
    assert cli("predict", package, tmp_path / "in", "--out", out)[0] == 0
    before = tree_hash(out)
    # the same DIR with other settings
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out, "--dpi", "200")
    assert code == 2 and err == (f"pipe predict: error: --out {out}: written by another package or settings (dpi "
                                 "144.0, now 200.0); resume with the same ones or use another --out\n")
    # another package (a copy, re-packaged: a manifest of another sha256)
    other = tmp_path / "other"
    shutil.copytree(package, other)
    m = json.loads((other / "manifest.json").read_text())
    m["created"] = "another time"
    (other / "manifest.json").write_text(json.dumps(m))
    code, _, err = cli("predict", other, tmp_path / "in", "--out", out)
    assert code == 2 and "written by another package or settings (package_sha256" in err and err.count("\n") == 1
    # a tampered package, as pipe serve refuses it
    tampered = tmp_path / "tampered"
    shutil.copytree(package, tampered)
    raw = bytearray((tampered / "model.pdiparams").read_bytes())
    raw[100] ^= 0xFF
    (tampered / "model.pdiparams").write_bytes(bytes(raw))
    code, _, err = cli("predict", tampered, tmp_path / "in", "--out", tmp_path / "out2")
    assert code == 2 and "model.pdiparams" in err and err.count("\n") == 1
    # an empty input set, a missing INPUT
    (tmp_path / "empty").mkdir()
    code, _, err = cli("predict", package, tmp_path / "empty", "--out", tmp_path / "out3")
    assert code == 2 and err == (f"pipe predict: error: INPUT: no images (.png, .jpg, .jpeg) or PDFs in "
                                 f"{tmp_path / 'empty'}\n")
    code, _, err = cli("predict", package, tmp_path / "nope", "--out", tmp_path / "out3")
    assert code == 2 and err == f"pipe predict: error: {tmp_path / 'nope'}: no such file or folder\n"
    assert tree_hash(out) == before
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out3").exists()


def test_engine_flag_runs_an_engine_that_reads_the_files_and_refuses_one_that_does_not(package, tmp_path, cli):
    """--engine paddle (the package's own, named): the rows and the engine recorded; --engine openvino on this PIR
    package (which OpenVINO does not read) is refused in one line before anything is written, as pipe serve
    refuses it."""
    _images(tmp_path / "in", n=4)
    code, _, err = cli("predict", package, tmp_path / "in", "--out", tmp_path / "pd", "--engine", "paddle",
                       "--device", "cpu", "--threads", "1")
    assert code == 0, err
    assert len(rows(tmp_path / "pd" / output.PREDICTIONS)) == 4
    assert json.loads((tmp_path / "pd" / output.SUMMARY).read_text())["engine"] == "paddle_inference"
    code, _, err = cli("predict", package, tmp_path / "in", "--out", tmp_path / "ov", "--engine", "openvino")
    assert code == 2 and err.count("\n") == 1 and "--engine openvino:" in err and "which openvino does not run" in err
    assert not (tmp_path / "ov").exists()
