"""The two tiers stay what the Makefile says: `make test` runs everything, `make quick` runs `-m "not slow"`, and
the quick tier holds every test module's fast tests, its error paths among them, and none that runs the real
pretrained models.

The whole tree is collected here in a fresh pytest (`tests.tier_collect` writes what decides each test's tier), so
modules written after this one are held to the same rules, each broken one named: a module whose tests are all
`slow` says why in its module-level mark (`pytestmark = pytest.mark.slow(reason="...")`), so a bare module-wide
mark or a module that lost its last quick test fails; a module whose tests named for an error path (refused, bad,
wrong, tampered, exit N, ...) are all `slow` fails, since a developer's change breaks those most and `make quick`
would check none (a serving module's bad-request table therefore stays quick: its one server costs ~4 CPU-s)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

# the fixtures the real PP-OCRv4 models come through (conftest.py; the imports ppocr_*_export build on them); `keys`
# alone reads the wheel's character list, which the venv's set-up fetched, and stays quick
REAL_MODELS = {"rec_src", "det_src", "cls_src"}
# a test named for an error path (a module-wide slow(reason=...) excuses its module)
ERROR_PATH = re.compile(r"refuse|reject|error|invalid|bad_|wrong|tamper|malformed|exits?_?\d|_fails?_|mismatch")


@pytest.fixture(scope="module")
def collected(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("tiers") / "items.json"
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                        "-p", "tests.tier_collect", "tests"], cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"},  # no -m from there
                            "PIPE_TIER_OUT": str(out),
                            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text(encoding="utf-8"))


def _modules() -> list[str]:
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "tests").rglob("test_*.py"))


def test_every_module_keeps_quick_tests_or_says_why_it_has_none(collected):
    by_module: dict[str, list[dict]] = {m: [] for m in _modules()}
    for row in collected:
        by_module.setdefault(row["module"], []).append(row)
    assert len(by_module) > 50 and sum(not r["slow"] for r in collected) > 500  # the tree, not a corner of it
    empty = [m for m, rows in by_module.items() if not rows]
    assert not empty, f"modules that collected no test: {empty}"
    bare = sorted({r["module"] for r in collected if any(not k.get("reason") for k in r["module_slow"])})
    assert not bare, f"a module-wide slow mark without reason=: {bare} (mark the slow tests, or say why all are)"
    unsaid = [m for m, rows in by_module.items() if all(r["slow"] for r in rows) and not rows[0]["module_slow"]]
    assert not unsaid, (f"every test of {unsaid} is marked slow, so `make quick` runs none of them: keep the fast "
                        "ones quick, or say why none is with pytestmark = pytest.mark.slow(reason=...)")


def test_no_quick_test_needs_the_real_models(collected):
    real = [r["id"] for r in collected if not r["slow"] and REAL_MODELS & set(r["fixtures"])]
    assert not real, f"these use the real PP-OCRv4 models ({sorted(REAL_MODELS)}) and are not marked slow: {real}"


def test_a_modules_error_paths_keep_a_quick_test(collected):
    errors: dict[str, list[dict]] = {}
    for row in collected:
        if ERROR_PATH.search(row["name"].split("[")[0]) and not row["module_slow"]:
            errors.setdefault(row["module"], []).append(row)
    assert len(errors) > 20
    lost = {m: sorted({r["name"].split("[")[0] for r in rows})
            for m, rows in errors.items() if all(r["slow"] for r in rows)}
    assert not lost, f"every error-path test of these modules is marked slow, so `make quick` checks none: {lost}"


def test_make_quick_deselects_slow_and_make_test_runs_everything():
    make = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+):[^\n]*\n((?:\t[^\n]*\n)+)", make, re.M)}
    assert '-m "not slow"' in recipe["quick"] and "pytest" in recipe["quick"]
    assert "pytest" in recipe["test"] and "slow" not in recipe["test"]  # everything, the slow tests included
