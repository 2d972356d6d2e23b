"""A pytest plugin for tests/test_tiers.py: `pytest --collect-only -p tests.tier_collect` writes, for every test
collected, what decides its tier (JSON to the file $PIPE_TIER_OUT): its module, whether it is marked `slow`, the
`slow` marks set on its module (with their keywords) and the fixtures it uses, directly or through others."""

from __future__ import annotations

import json
import os

import pytest


def pytest_collection_modifyitems(session, config, items):
    rows = []
    for item in items:
        module_marks = [m.kwargs for node, m in item.iter_markers_with_node("slow") if isinstance(node, pytest.Module)]
        rows.append({"id": item.nodeid, "module": item.nodeid.split("::")[0], "name": item.name,
                     "slow": item.get_closest_marker("slow") is not None, "module_slow": module_marks,
                     "fixtures": sorted(getattr(item, "fixturenames", ()))})
    with open(os.environ["PIPE_TIER_OUT"], "w", encoding="utf-8") as f:
        json.dump(rows, f)
