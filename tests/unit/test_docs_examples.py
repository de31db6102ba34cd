"""The YAML in the docs and the README parses: a reader can paste it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_yaml_block_parses(page: Path) -> None:
    for block in re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S):
        list(yaml.safe_load_all(block))  # raises, naming the line, if a block is broken
