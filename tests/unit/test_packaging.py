"""A regular install (`pip install .`, what `make install` does) carries every package: the
list in pyproject.toml is explicit, and an editable install would not notice one missing."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_python_package_in_the_tree_is_in_pyproject() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = set()
    for name, folder in setuptools["package-dir"].items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            relative = init.parent.relative_to(base).parts
            if "tests" in relative or "__pycache__" in relative:
                continue
            found.add(".".join((name, *relative)))
    assert found - listed == set()
