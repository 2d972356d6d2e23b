"""The wheel a user builds (`pip wheel --no-deps -w dist .`), installed where the work tree is not importable:
it holds every module and data file of pipeline/ and stages/, and its `pipe all` runs on digits.

`make` installs pipe editable, so every other test imports pipeline/ and stages/ from the work tree whatever
the wheel holds: a hand-written package list once built a wheel without pipeline/engines while they passed.
The wheel is built from a copy of the sources (setuptools writes build/ and *.egg-info beside them) with
build isolation, as the README's command does: the setuptools that `python -m venv` puts in .venv may be too
old to build a wheel on its own. It is installed with `pip --python` into a venv made in tmp_path, which
then sees this venv's pinned dependencies (paddle etc.) through a path line in a .pth file. Python adds
such a line to sys.path but does not process the .pth files in that directory, so the editable install's
finder stays out and `import pipeline` can only come from the wheel (asserted). Commands run from tmp_path
with no PYTHONPATH, and HOME in tmp_path: paddle, onnxruntime, OpenVINO and matplotlib write under ~."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow(reason="builds the wheel and installs it into a fresh venv")
TOPS = ("pipeline", "stages")
SOURCES = ("pyproject.toml", "README.md", *TOPS)  # what the build reads
FAST = ["--set", "train.epochs=2", "--set", "compress.backend=onnxruntime", "--set", "compress.latency_runs=20",
        "--set", "compress.throughput_runs=5"]  # as tests/test_all.py; release.min_accuracy is 0 by default
STAGES = ("train", "export", "compress", "package")


def _source_files() -> list[str]:
    """Every file under pipeline/ and stages/ (modules and data), as wheel paths."""
    found = []
    for top in TOPS:
        for dirpath, dirnames, names in os.walk(REPO / top):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            found += [(Path(dirpath) / n).relative_to(REPO).as_posix() for n in names if not n.endswith(".pyc")]
    return sorted(found)


def _run(cmd: list, *, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """cmd in a session of its own; on a timeout its whole process group is killed, so nothing outlives the test."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, src / name)
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q", "-w", root / "dist", src],
             cwd=root))
    (whl,) = (root / "dist").glob("paddle_pipe-*.whl")
    yield whl
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> tuple[Path, dict]:
    """(venv, env): the wheel installed in a fresh venv, and the environment to run it in."""
    root = tmp_path_factory.mktemp("installed")
    venv, home = root / "venv", root / "home"
    home.mkdir()
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root))
    py = venv / "bin" / "python"
    _ok(_run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-cache-dir", "-q", wheel],
             cwd=root))
    # Only after the install: pip saw a venv holding nothing, and had nothing of the dev venv to uninstall.
    site = _ok(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root)).strip()
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (Path(site) / "dev-venv-dependencies.pth").write_text("".join(f"{p}\n" for p in deps))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PIPE_CACHE_DIR=str(home / "pipe-cache"))
    yield venv, env
    shutil.rmtree(root)


def test_the_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    files = _source_files()
    packages = [f for f in files if f.endswith("/__init__.py")]
    assert {"pipeline/__init__.py", "pipeline/engines/__init__.py", "stages/__init__.py"} <= set(packages)
    assert "pipeline/assets/digits.npz" in files
    assert [f for f in files if f not in names] == []


def test_the_distribution_is_paddle_pipe_and_leaves_pipe_alone(wheel):
    """`pipe` on PyPI is another library (pipe 2.2: one module, pipe.py, in a distribution named pipe): ours is
    paddle-pipe, whose top-level names (pipeline/, stages/, its dist-info) none of its files share, and which
    gives the command `pipe`."""
    z = zipfile.ZipFile(wheel)
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    fields = dict(line.split(": ", 1) for line in z.read(meta).decode().splitlines() if ": " in line)
    assert fields["Name"] == "paddle-pipe"
    tops = {n.split("/", 1)[0] for n in z.namelist()}
    assert tops == {"pipeline", "stages", f"paddle_pipe-{fields['Version']}.dist-info"}
    assert not tops & {"pipe.py", "pipe", "pipe-2.2.dist-info"}
    entry = z.read(meta.replace("METADATA", "entry_points.txt")).decode()
    assert "pipe = pipeline.cli:main" in entry


def test_the_installed_wheel_imports_from_its_own_venv(installed, tmp_path):
    venv, env = installed
    packages = sorted(f[:-len("/__init__.py")].replace("/", ".") for f in _source_files() if f.endswith("/__init__.py"))
    code = f"import importlib\nfor name in {packages!r}:\n    print(importlib.import_module(name).__file__)"
    out = _ok(_run([venv / "bin" / "python", "-c", code], cwd=tmp_path, env=env)).split()
    assert len(out) == len(packages) and all(Path(f).is_relative_to(venv) for f in out), out
    out = _ok(_run([venv / "bin" / "pipe", "--help"], cwd=tmp_path, env=env))
    assert "Usage: pipe" in out


def test_the_installed_pipe_all_runs_every_stage_on_digits(installed, tmp_path):
    venv, env = installed
    config = tmp_path / "digits.yaml"
    shutil.copyfile(REPO / "examples" / "digits.yaml", config)
    run = tmp_path / "run"
    _ok(_run([venv / "bin" / "pipe", "all", "--config", config, "--run", run, *FAST], cwd=tmp_path, env=env))
    for stage in STAGES:
        assert json.loads((run / stage / "manifest.json").read_text())["stage"] == stage


def _pipe_22_stand_in(root: Path) -> Path:
    """A wheel with the file names of PyPI's pipe 2.2 (`pip download --no-deps pipe==2.2`: pipe.py and
    pipe-2.2.dist-info/ with LICENSE, METADATA, WHEEL, top_level.txt, RECORD), made here: no registry in tests."""
    import base64
    import hashlib

    files = {
        "pipe.py": '"""Stand-in for pipe 2.2 (sh-like infix syntax), made by tests/test_wheel.py."""\nSTAND_IN = True\n',
        "pipe-2.2.dist-info/LICENSE": "MIT\n",
        "pipe-2.2.dist-info/METADATA": "Metadata-Version: 2.1\nName: pipe\nVersion: 2.2\n",
        "pipe-2.2.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "pipe-2.2.dist-info/top_level.txt": "pipe\n",
    }
    record = ""
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(text.encode())}\n"
    whl = root / "pipe-2.2-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr("pipe-2.2.dist-info/RECORD", record + "pipe-2.2.dist-info/RECORD,,\n")
    return whl


def test_pipe_22_installs_beside_the_wheel_and_replaces_nothing(wheel, installed, tmp_path):
    """Under the distribution name `pipe`, pip took PyPI's pipe 2.2 for an upgrade of ours: it uninstalled
    pipeline/, stages/ and the command. As paddle-pipe, both stay: `pipe` the command is ours, `import pipe`
    is theirs. Last in this file: it adds a package to the shared venv."""
    venv, env = installed
    py = venv / "bin" / "python"
    _ok(_run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "--no-cache-dir",
              "-q", _pipe_22_stand_in(tmp_path)], cwd=tmp_path))
    site = Path(_ok(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path,
                         env=env)).strip())
    ours = "-".join(wheel.name.split("-")[:2]) + ".dist-info"  # paddle_pipe-0.1.0.dist-info
    assert {"pipe.py", "pipe-2.2.dist-info", ours, *TOPS} <= {p.name for p in site.iterdir()}
    code = "import pipe, pipeline, stages; print(pipe.STAND_IN, pipe.__file__, pipeline.__file__, stages.__file__)"
    out = _ok(_run([py, "-c", code], cwd=tmp_path, env=env)).split()
    assert out[0] == "True" and all(Path(f).is_relative_to(site) for f in out[1:]), out
    assert "Usage: pipe" in _ok(_run([venv / "bin" / "pipe", "--help"], cwd=tmp_path, env=env))
