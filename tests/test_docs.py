"""The README and docs/ stay true to the CLI: every `--flag` of a `pipe <command>` line in a fenced block is a
real option of that command, every config key they name (`--set section.key=...`, `section.key` in
backquotes) is a real key, and every relative link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipeline import config as config_mod
from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# `model.*` in backquotes is mostly a file (model.json) or serving.yaml's section: checked through --set only
SECTIONS = {k.split(".")[0] for k, _, _ in config_mod.describe()} - {"model"}
FILES = (".py", ".json", ".onnx", ".pdiparams", ".pdmodel", ".safetensors", ".txt", ".yaml", ".md", ".npz", ".npy")


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, flags) of every `pipe <command> ...` line inside ``` fences (continuation lines joined)."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            m = re.search(r"(?:^|\s|\$ )pipe ([a-z]+)\b(.*)", line.split("#", 1)[0])
            if m:
                out.append((m.group(1), re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", m.group(2))))
    return out


def _options(command: str) -> set[str]:
    import typer

    from pipeline.cli import app

    cmd = getattr(typer.main.get_command(app), "commands", {}).get(command)
    assert cmd is not None, f"pipe {command}: no such command"
    return {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_line_uses_real_flags(page):
    text = page.read_text(encoding="utf-8")
    bad = [(cmd, f) for cmd, flags in _commands(text) for f in flags if f not in _options(cmd) and f != "--debug"]
    assert bad == [], f"{page.name}: flags that pipe does not have: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_config_key_named_is_real(page):
    text = page.read_text(encoding="utf-8")
    keys = set(config_mod._all_keys())
    named = set(re.findall(r"--set ([a-z_]+\.[a-z0-9_]+)=", text))
    named |= {k for k in re.findall(r"`([a-z_]+\.[a-z0-9_]+)`", text)
              if k.split(".")[0] in SECTIONS and not k.endswith(FILES)}
    # a key written with alternatives, e.g. `data.coco_{train,val,test}_json`, is checked by its expansions
    bad = sorted(k for k in named if k not in keys and k != "section.key")  # usage.md: the placeholder
    assert bad == [], f"{page.name}: config keys that do not exist: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    text = page.read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)#\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
    missing = [t for t in links if not (page.parent / t).exists()]
    assert missing == [], f"{page.name}: links to nothing: {missing}"


def test_the_readme_is_short_and_every_docs_page_is_linked():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    assert pages and {p for p in pages if f"docs/{p}" not in readme} == set()


def test_the_commands_found_are_many():
    """The scan above is not vacuous: it finds the commands the pages show."""
    found = [c for page in PAGES for c, _ in _commands(page.read_text(encoding="utf-8"))]
    assert {"train", "export", "import", "compress", "package", "serve", "all", "inspect"} <= set(found)
    assert len(found) >= 20
