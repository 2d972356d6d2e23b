"""`pipe predict` on the session's tiny text package (text_cnn, max_len 24): texts from .txt lines, a .tsv column and
.jsonl members (`--field`); each row's answer is /v1/predict's for {"text": [that text]} (serve's own request path);
a text over the package's max_len and a row without the field become error rows; a rerun with another --field is
refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline.predict import output
from tests.serving_helpers import packaged_text_run
from tests.stages.test_predict import v1_bodies

pytestmark = pytest.mark.slow(reason="trains, exports and packages a text model; starts predictor processes")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    return packaged_text_run(tmp_path_factory.mktemp("predict-text")) / "package"


def test_text_rows_are_v1_answers(package, tmp_path, cli):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("这个东西很好\n\n买了很失望\n" + "好" * 30 + "\n", encoding="utf-8")
    (tmp_path / "in" / "b.tsv").write_text("id\tbody\n1\t还是满意\n", encoding="utf-8")
    (tmp_path / "in" / "c.jsonl").write_text('{"body": "差"}\n{"title": "no body"}\n', encoding="utf-8")
    out = tmp_path / "out"
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out, "--field", "body", "--workers", "1")
    assert code == 5 and err.endswith(f"2 of 6 items failed; see {out / output.ERRORS}\n"), err
    rows = [json.loads(x) for x in (out / output.PREDICTIONS).read_text(encoding="utf-8").splitlines()]
    texts = ["这个东西很好", "买了很失望", "还是满意", "差"]
    assert [(Path(r["source"]).name, r["line"]) for r in rows] == [("a.txt", 1), ("a.txt", 3), ("b.tsv", 2),
                                                                    ("c.jsonl", 1)]
    assert [r["sha256"] for r in rows] == [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    assert [r["answer"] for r in rows] == v1_bodies(package, [{"text": [t]} for t in texts])
    errors = [(Path(r["source"]).name, r["line"], r["error"]) for r in
              map(json.loads, (out / output.ERRORS).read_text(encoding="utf-8").splitlines())]
    assert errors == [("a.txt", 4, "30 characters, over the package's max_len of 24"),
                      ("c.jsonl", 2, "no text in field 'body' (--field)")]
    code, _, err = cli("predict", package, tmp_path / "in", "--out", out, "--field", "title")
    assert code == 2 and "(field 'body', now 'title')" in err
