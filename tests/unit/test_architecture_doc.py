"""docs/architecture.md names the functions an XID passes through; each must exist, so the
walk-through cannot drift from the code."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
# `room/module.Name.attr`, `room/module.function`, or a module as a file: `room/module.py`
DOTTED = re.compile(r"`((?:[a-z_]+/)*[a-z_]+)\.([A-Za-z_]+)(?:\.([A-Za-z_]+))?`")
# `Class.method`, of a class in a module the walk-through names
METHOD = re.compile(r"`([A-Z][A-Za-z]+)\.([_a-z]+)`")


def test_every_hop_of_the_xid_walk_through_is_in_the_code() -> None:
    text = DOC.read_text()
    walk = text[text.index("## An XID, from the driver") :]
    modules: list[ModuleType] = []
    named = 0
    for found in DOTTED.finditer(walk):
        path, name, attr = found.groups()
        module = importlib.import_module("gpuwatch." + path.replace("/", "."))
        modules.append(module)
        if name in ("py", "tsv"):  # the file itself
            continue
        assert hasattr(module, name), found.group(0)
        if attr:
            assert hasattr(getattr(module, name), attr), found.group(0)
        named += 1
    for found in METHOD.finditer(walk):
        cls, method = found.groups()
        owners = [getattr(m, cls) for m in modules if isinstance(getattr(m, cls, None), type)]
        assert owners, f"{found.group(0)}: no module the walk-through names has {cls}"
        assert any(hasattr(owner, method) for owner in owners), found.group(0)
        named += 1
    assert named >= 25
