"""pipeline/artifacts.py: a stage dir is complete and verifiable, or absent; verify names the bad file."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from pipeline import artifacts
from pipeline.errors import InputError

CONFIG = {"train": {"lr": 0.1}}


def _make(target: Path, stage: str = "train", files: dict[str, bytes] | None = None,
          input: artifacts.Artifact | None = None, metrics: dict | None = None) -> artifacts.Artifact:
    files = {"model.bin": b"\x00\x01weights" * 10, "sub/notes.txt": b"hello\n"} if files is None else files
    with artifacts.write_stage(target, stage, CONFIG, input) as w:
        for name, data in files.items():
            (w.dir / name).parent.mkdir(parents=True, exist_ok=True)
            (w.dir / name).write_bytes(data)
        w.metrics = metrics if metrics is not None else {"acc": 0.5}
        w.interface = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 3]}]}
    return artifacts.verify(target, (stage,))


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


def _verify_error(path: Path, stages: tuple[str, ...] = ("train",)) -> str:
    with pytest.raises(InputError) as info:
        artifacts.verify(path, stages)
    assert info.value.exit_code == 2
    assert "\n" not in str(info.value)
    return str(info.value)


# ------------------------------------------------------------------ writing


def test_exception_inside_write_leaves_nothing(tmp_path):
    target = tmp_path / "train"
    with pytest.raises(RuntimeError, match="boom"):
        with artifacts.write_stage(target, "train", CONFIG) as w:
            (w.dir / "model.bin").write_bytes(b"partial")
            assert w.dir.is_dir() and ".tmp-" in w.dir.name and w.dir.parent == tmp_path
            raise RuntimeError("boom")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_exception_inside_rewrite_keeps_the_old_artifact(tmp_path):
    target = tmp_path / "train"
    _make(target, files={"model.bin": b"old"})
    before = (target / artifacts.MANIFEST).read_bytes()
    with pytest.raises(KeyboardInterrupt):
        with artifacts.write_stage(target, "train", CONFIG) as w:
            (w.dir / "model.bin").write_bytes(b"new")
            raise KeyboardInterrupt
    assert (target / "model.bin").read_bytes() == b"old"
    assert (target / artifacts.MANIFEST).read_bytes() == before
    assert _leftovers(tmp_path) == []
    artifacts.verify(target, ("train",))


def test_successful_write_replaces_the_old_artifact_whole(tmp_path):
    target = tmp_path / "train"
    _make(target, files={"model.bin": b"old weights", "old_only.txt": b"stale", "d/x.txt": b"1"},
          metrics={"acc": 0.1})
    art = _make(target, files={"model.bin": b"new weights"}, metrics={"acc": 0.9})
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == ["manifest.json", "model.bin"]
    assert (target / "model.bin").read_bytes() == b"new weights"
    assert art.manifest["metrics"] == {"acc": 0.9}
    assert set(art.manifest["files"]) == {"model.bin"}
    assert _leftovers(tmp_path) == []


def test_stale_tmp_dir_of_this_pid_is_cleared(tmp_path):
    target = tmp_path / "train"
    stale = tmp_path / f"train.tmp-{os.getpid()}"
    stale.mkdir()
    (stale / "junk.bin").write_bytes(b"from a crashed run")
    art = _make(target, files={"model.bin": b"w"})
    assert set(art.manifest["files"]) == {"model.bin"}
    assert _leftovers(tmp_path) == []


def test_manifest_has_every_field(tmp_path):
    data = {"model.bin": b"abc" * 100, "sub/notes.txt": b"hello\n"}
    art = _make(tmp_path / "train", files=data)
    m = art.manifest
    assert set(m) >= {"schema_version", "stage", "created", "versions", "device", "config", "input", "files",
                      "metrics", "interface"}
    assert m["schema_version"] == artifacts.SCHEMA_VERSION == 1
    assert m["stage"] == "train"
    assert len(m["created"]) == 20 and m["created"].endswith("Z") and m["created"][10] == "T"
    assert m["versions"]["pipe"] and m["versions"]["python"].count(".") == 2
    assert "numpy" in m["versions"]
    assert isinstance(m["device"], str) and m["device"]
    assert m["config"] == CONFIG
    assert m["input"] is None
    assert m["metrics"] == {"acc": 0.5}
    assert m["interface"]["inputs"][0]["shape"] == [-1, 3]
    assert m["files"] == {name: {"sha256": hashlib.sha256(b).hexdigest(), "bytes": len(b)} for name, b in data.items()}
    raw = (tmp_path / "train" / artifacts.MANIFEST).read_bytes()
    assert art.manifest_sha256 == hashlib.sha256(raw).hexdigest()
    assert json.loads(raw) == m


def test_manifest_records_its_input(tmp_path):
    parent = _make(tmp_path / "run" / "train")
    child = _make(tmp_path / "run" / "export", stage="export", input=parent)
    inp = child.manifest["input"]
    assert inp == {"path": "../train", "stage": "train", "manifest_sha256": parent.manifest_sha256}


def test_extra_fields_land_in_the_manifest(tmp_path):
    with artifacts.write_stage(tmp_path / "e", "export", CONFIG) as w:
        (w.dir / "model.json").write_text("{}")
        w.extra = {"format": "pir"}
    assert artifacts.verify(tmp_path / "e", ("export",)).manifest["format"] == "pir"


def test_write_text_atomic_replaces_a_pointer(tmp_path):
    p = tmp_path / "last"
    artifacts.write_text_atomic(p, "step-000001")
    artifacts.write_text_atomic(p, "step-000002")
    assert p.read_text() == "step-000002"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["last"]


# ------------------------------------------------------------------ verify


@pytest.fixture
def art(tmp_path) -> Path:
    target = tmp_path / "train"
    _make(target, files={"model.bin": bytes(range(256)) * 4, "sub/notes.txt": b"hello\n"})
    return target


def test_verify_accepts_a_good_artifact(art):
    a = artifacts.verify(art, ("train", "export"))
    assert a.stage == "train"
    assert a.file("model.bin") == art / "model.bin"
    with pytest.raises(InputError, match=r"manifest\.json: lists no file missing\.bin"):
        a.file("missing.bin")


def test_verify_missing_manifest(art):
    (art / artifacts.MANIFEST).unlink()
    assert _verify_error(art) == f"{art / 'manifest.json'}: missing (not a pipe artifact, or an interrupted write)"


def test_verify_invalid_json_manifest(art):
    (art / artifacts.MANIFEST).write_text('{"stage": "train",')
    assert _verify_error(art) == f"{art / 'manifest.json'}: not valid JSON"


def test_verify_manifest_missing_a_field(art):
    m = json.loads((art / artifacts.MANIFEST).read_text())
    del m["files"]
    (art / artifacts.MANIFEST).write_text(json.dumps(m))
    assert _verify_error(art) == f"{art / 'manifest.json'}: missing field files"


def test_verify_malformed_file_entry(art):
    m = json.loads((art / artifacts.MANIFEST).read_text())
    m["files"]["model.bin"] = "deadbeef"
    (art / artifacts.MANIFEST).write_text(json.dumps(m))
    assert _verify_error(art) == f"{art / 'manifest.json'}: entry for model.bin must be a mapping with sha256 and bytes"


def test_verify_wrong_stage(art):
    assert _verify_error(art, ("export",)) == f"{art / 'manifest.json'}: stage is 'train', expected export"
    assert _verify_error(art, ("compress", "export")).endswith("expected compress or export")


def test_verify_missing_file(art):
    (art / "sub" / "notes.txt").unlink()
    assert _verify_error(art) == f"{art / 'manifest.json'}: missing file sub/notes.txt"


def test_verify_truncated_file(art):
    path = art / "model.bin"
    path.write_bytes(path.read_bytes()[:-1])
    assert _verify_error(art) == f"{art / 'manifest.json'}: size mismatch for model.bin (1023 bytes, manifest says 1024)"


def test_verify_flipped_byte_same_size(art):
    path = art / "model.bin"
    data = bytearray(path.read_bytes())
    data[500] ^= 0x01
    path.write_bytes(bytes(data))
    assert _verify_error(art) == f"{art / 'manifest.json'}: sha256 mismatch for model.bin"


def test_verify_extra_unlisted_file(art):
    (art / "sub" / "payload.pkl").write_bytes(b"not ours")
    assert _verify_error(art) == f"{art / 'manifest.json'}: unexpected file sub/payload.pkl (not in the manifest)"


def test_verify_refuses_a_tmp_directory(art):
    tmp = art.parent / f"train.tmp-{os.getpid() + 1}"
    art.rename(tmp)  # a complete-looking dir is still refused by its name
    assert _verify_error(tmp) == f"{tmp}: an unfinished temporary directory, not an artifact"


def test_verify_refuses_a_tmp_directory_inside(art):
    stray = art / "step-000001.tmp-123"
    stray.mkdir()
    (stray / "model.bin").write_bytes(b"half")
    assert _verify_error(art) == f"{art / 'manifest.json'}: unexpected file step-000001.tmp-123/model.bin (not in the manifest)"


def test_verify_missing_directory(tmp_path):
    assert _verify_error(tmp_path / "nope") == f"{tmp_path / 'nope'}: no such artifact directory"


def test_verify_other_schema_version(art):
    m = json.loads((art / artifacts.MANIFEST).read_text())
    m["schema_version"] = 99
    (art / artifacts.MANIFEST).write_text(json.dumps(m))
    assert _verify_error(art) == f"{art / 'manifest.json'}: schema_version 99, this pipe reads 1"


# ------------------------------------------------------------------ lineage


def test_lineage_follows_inputs_back(tmp_path):
    run = tmp_path / "run"
    train = _make(run / "train")
    export = _make(run / "export", stage="export", input=train)
    compress = _make(run / "compress", stage="compress", input=export)
    chain = artifacts.lineage(compress)
    assert [(a.stage, a.path.resolve(), note) for a, note in chain] == [
        ("compress", (run / "compress").resolve(), ""),
        ("export", (run / "export").resolve(), ""),
        ("train", (run / "train").resolve(), ""),
    ]


def test_lineage_flags_a_parent_that_changed(tmp_path):
    run = tmp_path / "run"
    train = _make(run / "train", metrics={"acc": 0.5})
    export = _make(run / "export", stage="export", input=train)
    _make(run / "train", metrics={"acc": 0.6})  # re-trained after export used it
    chain = artifacts.lineage(export)
    assert [a.stage for a, _ in chain] == ["export", "train"]
    assert chain[0][1] == ""
    assert chain[1][1] == "changed since it was used (re-run the later stages)"


def test_lineage_reports_a_tampered_parent(tmp_path):
    run = tmp_path / "run"
    train = _make(run / "train")
    export = _make(run / "export", stage="export", input=train)
    (run / "train" / "model.bin").write_bytes(b"x")
    chain = artifacts.lineage(export)
    assert chain[1][0] is None
    assert chain[1][1].startswith(f"{(run / 'train').resolve() / 'manifest.json'}: size mismatch for model.bin")
    # Without checking, the chain is read as recorded.
    unchecked = artifacts.lineage(export, check=False)
    assert [(a.stage, note) for a, note in unchecked] == [("export", ""), ("train", "")]


def test_lineage_reports_a_missing_parent(tmp_path):
    run = tmp_path / "run"
    train = _make(run / "train")
    export = _make(run / "export", stage="export", input=train)
    (run / "train" / artifacts.MANIFEST).unlink()
    chain = artifacts.lineage(export)
    assert len(chain) == 2 and chain[1][0] is None
    assert chain[1][1].endswith("manifest.json: missing (not a pipe artifact, or an interrupted write)")
