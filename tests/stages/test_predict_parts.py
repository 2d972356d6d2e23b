"""`pipe predict`'s parts without a model (quick tier): what inputs expand to (folders, globs, @lists, PDF pages, text
files), the output directory's resume rules (a torn last line cut, a foreign fingerprint and a second writer refused),
the worker plan from the cores this process may use, and `--ray`'s parts that need no cluster (the travelled
package's check, the items sent to the actors)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from pipeline.errors import InputError
from pipeline.predict import inputs, output, run
from tests.stages.test_predict import encrypted_pdf, make_pdf


def _ids(xs) -> list[tuple]:
    return [(type(x).__name__, os.path.basename(x.source), x.page, x.line, getattr(x, "text", None)) for x in xs]


def test_inputs_expand_folders_globs_lists_and_pdf_pages(tmp_path):
    (tmp_path / "in" / "b").mkdir(parents=True)
    for name in ("in/z.png", "in/a.JPG", "in/b/c.jpeg", "in/notes.md", "x.png"):
        (tmp_path / name).write_bytes(b"x")
    make_pdf(tmp_path / "in" / "b" / "doc.pdf", pages=2)
    (tmp_path / "in" / "locked.pdf").write_bytes(encrypted_pdf())
    (tmp_path / "list.txt").write_text("# a comment\nx.png\n\nin/z.png\nmissing.png\n")
    got = list(inputs.expand([str(tmp_path / "in"), str(tmp_path / "*.png"), f"@{tmp_path / 'list.txt'}"], False,
                             "text"))
    # a folder's own files first (sorted), then each subfolder's (sorted)
    assert _ids(got) == [("Item", "a.JPG", None, None, None), ("Problem", "locked.pdf", None, None, None),
                         ("Item", "z.png", None, None, None), ("Item", "c.jpeg", None, None, None),
                         ("Item", "doc.pdf", 1, None, None), ("Item", "doc.pdf", 2, None, None),
                         ("Item", "x.png", None, None, None), ("Item", "x.png", None, None, None),
                         ("Item", "z.png", None, None, None), ("Problem", "missing.png", None, None, None)]
    assert got[1].error == "not a readable PDF (encrypted: it needs a password)"
    assert got[4].sha256 == hashlib.sha256((tmp_path / "in/b/doc.pdf").read_bytes()).hexdigest()
    assert got[6].source == str(tmp_path / "x.png") and got[7].source == str(tmp_path / "x.png")
    assert inputs.count([str(tmp_path / "in")], False, "text") == 6
    with pytest.raises(InputError, match="no such file or folder"):
        inputs.check([str(tmp_path / "nothing")])
    with pytest.raises(InputError, match="a glob matching nothing"):
        inputs.check([str(tmp_path / "*.gif")])


def test_inputs_texts_from_txt_tsv_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("first line\n\n  \nsecond\n", encoding="utf-8")
    (tmp_path / "b.tsv").write_text("id\tbody\n1\thello\n2\n", encoding="utf-8")
    (tmp_path / "c.jsonl").write_text('{"body": "好的"}\n\nnot json\n{"other": 1}\n', encoding="utf-8")
    got = list(inputs.expand([str(tmp_path)], True, "body"))
    assert _ids(got) == [("Item", "a.txt", None, 1, "first line"), ("Item", "a.txt", None, 4, "second"),
                         ("Item", "b.tsv", None, 2, "hello"), ("Problem", "b.tsv", None, 3, None),
                         ("Item", "c.jsonl", None, 1, "好的"), ("Problem", "c.jsonl", None, 3, None),
                         ("Problem", "c.jsonl", None, 4, None)]
    assert got[4].sha256 == hashlib.sha256("好的".encode()).hexdigest()
    assert [g.error for g in got if isinstance(g, inputs.Problem)] == [
        "no text in field 'body' (--field)", "not a JSON object", "no text in field 'body' (--field)"]
    (tmp_path / "d.tsv").write_text("id\ttext\n", encoding="utf-8")
    assert [g.error for g in inputs.expand([str(tmp_path / "d.tsv")], True, "body")] == [
        "no column 'body' in its header row (--field)"]


def test_output_cuts_a_torn_line_refuses_a_foreign_dir_and_a_second_writer(tmp_path):
    fp = {"package_sha256": "a" * 64, "dpi": 144.0}
    out = output.Output(tmp_path / "o", fp)
    out.write([{"source": "x", "page": None, "sha256": "1", "answer": {}}],
              [{"source": "y", "page": 2, "sha256": "2", "error": "bad"}])
    with pytest.raises(InputError, match="another pipe predict \\(pid %d\\) is writing there" % os.getpid()):
        output.Output(tmp_path / "o", fp)
    out.close()
    path = tmp_path / "o" / output.PREDICTIONS
    path.write_bytes(path.read_bytes() + b'{"source": "z", "pa')  # a kill mid-write
    out = output.Output(tmp_path / "o", fp)
    assert out.done == {("x", None, None, "1")} and out.failed == {("y", 2, None, "2")}
    out.close()
    assert path.read_bytes().endswith(b"}\n") and len(path.read_bytes().splitlines()) == 1
    with pytest.raises(InputError, match=r"written by another package or settings \(dpi 144.0, now 72.0\)"):
        output.Output(tmp_path / "o", {**fp, "dpi": 72.0})
    assert json.loads((tmp_path / "o" / output.FINGERPRINT).read_text()) == fp


def test_workers_and_threads_from_the_usable_cores():
    cores = run.available_cores()
    assert 1 <= cores <= len(os.sched_getaffinity(0))
    assert run.plan(8, None, None) == (4, 2) and run.plan(2, None, None) == (2, 1) and run.plan(1, None, None) == (1, 1)
    assert run.plan(8, 1, None) == (1, 8) and run.plan(8, 3, 5) == (3, 5)
    with pytest.raises(InputError, match="--workers: must be 1..64, got 0"):
        run.plan(4, 0, None)


def test_split_gives_each_sample_its_own_v1_answer():
    batch = {"labels": ["a", "b"], "scores": [0.9, 0.8], "outputs": {"emb": [[1, 2], [3, 4]]}}
    assert run.split(batch, 1) == {"labels": ["b"], "scores": [0.8], "outputs": {"emb": [[3, 4]]}}


def test_draw_puts_polygons_and_boxes_where_the_answer_says(tmp_path):
    """--draw's pictures from real files: an OCR page (polygon on the left half, text on the right), a detector's
    box; each decodes as a PNG named after its source, red where the answer's outline runs and not elsewhere."""
    from PIL import Image

    from pipeline.predict import draw

    page = tmp_path / "page.png"
    Image.new("RGB", (200, 120), (250, 250, 250)).save(page)
    lines = [{"points": [[20, 30], [150, 30], [150, 60], [20, 60]], "text": "你好 pipe", "score": 0.99}]
    dets = [{"label": "cat", "score": 0.9, "box": [100.0, 10.0, 180.0, 100.0]}]
    for task, answer, size in (("ocr_system", {"pages": [lines]}, (400, 120)),
                               ("detection", {"detections": [dets]}, (200, 120))):
        folder = tmp_path / task
        draw.Drawer(folder, task, 144.0, 1 << 24).rows([{"source": str(page), "page": None, "answer": answer}])
        with Image.open(folder / draw.name(str(page), None)) as im:
            assert im.format == "PNG" and im.size == size
            arr = np.asarray(im.convert("RGB")).astype(int)
        red = (arr[..., 0] > 200) & (arr[..., 1] < 80) & (arr[..., 2] < 80)
        if task == "ocr_system":
            assert red[30, 85] and red[45, 20] and not red[45, 85] and not red[100, 100]
            assert (arr[30:60, 220:350] < 100).all(axis=-1).any()  # the text written on the right half
        else:
            assert red[10, 140] and red[55, 100] and not red[55, 140] and not red[110, 20]
    assert draw.name("/a/b/scan.pdf", 3).startswith("scan.pdf.p0003-") and \
        draw.name("/a/x.png", None) != draw.name("/b/x.png", None)


def test_the_travelled_package_is_checked_whole_before_a_byte_is_written(tmp_path):
    """`--ray`'s actors get the package as bytes (`ray_job.package_files`) and write it only if the manifest is the
    driver's and every file is the manifest's; otherwise one line naming the file, and nothing written."""
    from pipeline.predict import ray_job

    pkg = tmp_path / "pkg"
    (pkg / "det").mkdir(parents=True)
    blobs = {"model.pdiparams": b"\x00weights" * 100, "det/serving.yaml": b"model: {}\n"}
    for rel, data in blobs.items():
        (pkg / rel).write_bytes(data)
    manifest = json.dumps({"files": {rel: {"sha256": hashlib.sha256(d).hexdigest(), "bytes": len(d)}
                                     for rel, d in blobs.items()}}).encode()
    (pkg / "manifest.json").write_bytes(manifest)
    files = ray_job.package_files(pkg)
    assert files == {"manifest.json": manifest, **blobs}
    sha = hashlib.sha256(manifest).hexdigest()
    ray_job.unpack_verified(files, sha, tmp_path / "ok")
    assert {p.relative_to(tmp_path / "ok").as_posix(): p.read_bytes() for p in (tmp_path / "ok").rglob("*")
            if p.is_file()} == files
    bad = [({**files, "model.pdiparams": b"\x01" + files["model.pdiparams"][1:]}, sha,
            "model.pdiparams: sha256 mismatch in the travelled package"),
           ({**files, "det/serving.yaml": files["det/serving.yaml"] + b"#"}, sha,
            "det/serving.yaml: sha256 mismatch in the travelled package"),
           (files, "0" * 64, "manifest.json: not the package the driver verified (sha256 differs)"),
           ({**files, "extra.pkl": b"x"}, sha, "extra.pkl: the travelled package and its manifest disagree"),
           ({k: v for k, v in files.items() if k != "det/serving.yaml"}, sha, "det/serving.yaml: the travelled")]
    for i, (got, want_sha, message) in enumerate(bad):
        with pytest.raises(InputError, match=re.escape(message)):
            ray_job.unpack_verified(got, want_sha, tmp_path / f"bad{i}")
        assert not (tmp_path / f"bad{i}").exists()
    evil = json.dumps({"files": {"../evil": {"sha256": hashlib.sha256(b"x").hexdigest(), "bytes": 1}}}).encode()
    with pytest.raises(InputError, match="a manifest path outside the package"):
        ray_job.unpack_verified({"manifest.json": evil, "../evil": b"x"}, hashlib.sha256(evil).hexdigest(),
                                tmp_path / "evil")
    assert not (tmp_path / "evil").exists() and not (tmp_path / "evil.x").exists()


def test_ray_items_skip_what_dir_holds_and_carry_an_image_paths_held_hashes(tmp_path):
    """`ray_job.todo`: a page or text DIR holds is counted skipped on the driver; an image file (its hash known only
    once read) goes to the actors with the hashes DIR holds for its path; a problem becomes an error row; an item
    listed twice goes once."""
    from pipeline.predict import ray_job

    out = output.Output(tmp_path / "out", {"package_sha256": "x"})
    try:
        out.write([{"source": "a.png", "page": None, "sha256": "aa", "answer": {}},
                   {"source": "d.pdf", "page": 1, "sha256": "dd", "answer": {}}],
                  [{"source": "d.pdf", "page": 2, "sha256": "dd", "error": "bad page"}])
        items = [inputs.Item("a.png", "image"), inputs.Item("b.png", "image"), inputs.Item("a.png", "image"),
                 inputs.Item("d.pdf", "page", page=1, sha256="dd"), inputs.Item("d.pdf", "page", page=2, sha256="dd"),
                 inputs.Item("d.pdf", "page", page=3, sha256="dd"), inputs.Problem("gone.png", "no such file")]
        docs, problems, counts = ray_job.todo(items, out)
    finally:
        out.close()
    got = [json.loads(d["item"]) for d in docs]
    assert [(g["source"], g["page"], g["held"]) for g in got] == [("a.png", None, ["aa"]), ("b.png", None, []),
                                                                  ("d.pdf", 3, [])]
    assert problems == [{"source": "gone.png", "page": None, "error": "no such file"}]
    assert (counts.items, counts.skipped, counts.previously_failed) == (2, 2, 1)


_ARENAS = """
import os, subprocess, sys
from pipeline.predict import run
print(run.few_malloc_arenas())
print(subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('MALLOC_ARENA_MAX'))"],
                     capture_output=True, text=True).stdout.strip())
"""


@pytest.mark.parametrize("preset, applied, child", [(None, "True", "2"), ("4", "False", "4")])
def test_malloc_arenas_are_capped_for_the_job_and_its_predictors_unless_the_user_chose(preset, applied, child):
    """glibc's mallopt(M_ARENA_MAX) in the job's own process, and MALLOC_ARENA_MAX for the processes it starts (its
    predictors); a value the user set is left as it is."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if preset is not None:
        env["MALLOC_ARENA_MAX"] = preset
    r = subprocess.run([sys.executable, "-c", _ARENAS], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [applied, child]
