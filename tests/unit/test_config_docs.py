"""docs/config.md against the parser: every key the parser accepts is documented, and every
documented key is accepted. The parser itself says what it accepts: a probe key in a section
is refused with the list of the keys that section takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpuwatch.config import load_config
from gpuwatch.text.yamlfile import FileError

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"
Path_ = list[str | int]


def documented() -> dict[str, list[str]]:
    """Section heading (`top level`, `sampling`, `notify.receivers[]`) -> keys in its table."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = re.match(r"## `?([^`]+)`?$", line)
        if heading:
            current = heading.group(1)
            sections[current] = []
        key = re.match(r"\| `([a-z_]+)` \|", line)
        if key and current is not None:
            sections[current].append(key.group(1))
    return sections


def as_path(section: str) -> Path_:
    if section == "top level":
        return []
    out: Path_ = []
    for part in section.split("."):
        out.append(part.removesuffix("[]"))
        if part.endswith("[]"):
            out.append(0)
    return out


def accepted(path: Path_, tmp_path: Path) -> list[str]:
    def nest(rest: Path_) -> object:
        if not rest:
            return {"__probe__": 1}
        return [nest(rest[1:])] if isinstance(rest[0], int) else {rest[0]: nest(rest[1:])}

    config = tmp_path / "probe.yaml"
    config.write_text(yaml.safe_dump(nest(path)))
    with pytest.raises(FileError) as caught:
        load_config(config)
    found = re.search(r"__probe__: unknown key; expected one of: (.*)", str(caught.value))
    assert found, str(caught.value)
    return found.group(1).split(", ")


@pytest.mark.parametrize("section", list(documented()))
def test_each_section_documents_exactly_the_keys_the_parser_takes(
    section: str, tmp_path: Path
) -> None:
    assert sorted(documented()[section]) == sorted(accepted(as_path(section), tmp_path))


def test_every_section_the_parser_has_is_documented() -> None:
    sections = documented()
    nested = {"sampling", "store", "log", "rules", "journal", "notify", "push"}
    assert nested <= set(sections)
    assert {"notify.receivers[]", "notify.route", "notify.inhibit_rules[]"} <= set(sections)
