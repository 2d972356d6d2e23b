"""The README and docs/ stay true to the CLI: every `--flag` of a `pipe <command>` line in a fenced block or
an inline code span is a real option of that command, every config key they name (`--set section.key=...`,
`section.key` in backquotes) is a real key, every relative link (and its #anchor) resolves, and
docs/index.md lists every page."""

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


def _flags(text: str) -> list[str]:
    return re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", text)


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, flags) of every `pipe <command> ...` line inside ``` fences (continuation lines joined), and of
    every inline code span that starts with `pipe <command>`, e.g. `pipe export --precision bf16`."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            m = re.search(r"(?:^|\s|\$ )pipe ([a-z]+)\b(.*)", line.split("#", 1)[0])
            if m:
                out.append((m.group(1), _flags(m.group(2))))
    prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
    out += [(m.group(1), _flags(m.group(2))) for m in re.finditer(r"`pipe ([a-z]+)\b([^`]*)`", prose)]
    return out


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


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
    links = [(t, a) for t, a in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", text) if not re.match(r"[a-z]+:", t)]
    missing = [t for t, _ in links if t and not (page.parent / t).exists()]
    assert missing == [], f"{page.name}: links to nothing: {missing}"
    bad = [f"{t}#{a}" for t, a in links if a and (page.parent / (t or page.name)).suffix == ".md"
           and a not in _anchors(page.parent / (t or page.name))]
    assert bad == [], f"{page.name}: links to headings that do not exist: {bad}"


def test_the_readme_is_short_and_every_docs_page_is_listed():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme
    stages = ("index", "train", "export", "compress", "package", "serve", "benchmarks", "verified")
    assert [p for p in stages if f"(docs/{p}.md)" not in readme] == []
    index = (REPO / "docs/index.md").read_text(encoding="utf-8")
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert pages and {p for p in pages if f"]({p})" not in index} == set()


def test_the_commands_found_are_many():
    """The scan above is not vacuous: it finds the commands the pages show."""
    found = [c for page in PAGES for c, _ in _commands(page.read_text(encoding="utf-8"))]
    assert {"train", "export", "import", "compress", "package", "serve", "all", "inspect"} <= set(found)
    assert len(found) >= 20
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(re.findall(r"\]\((docs/[a-z]+\.md)(?:#[^)]*)?\)", readme)) >= 8  # the link scan sees the README's links
