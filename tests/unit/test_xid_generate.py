"""The XID catalog module and the hardware pack's XID matchers are what catalog.tsv gives."""

from __future__ import annotations

import re

import pytest

from gpuwatch.xid import generate
from gpuwatch.xid.catalog import CATALOG
from gpuwatch.xid.known import lookup


def test_the_catalog_and_the_pack_are_written_from_the_table() -> None:
    for path, text in generate.outputs():
        assert path.read_text() == text, f"{path} is stale: run make xid-catalog"


def test_a_hand_edited_matcher_is_stale() -> None:
    _, rows = generate.read_table(generate.TABLE.read_text())
    pack = generate.PACK.read_text()
    edited = pack.replace('xid=~"46|', 'xid=~"', 1)
    assert edited != pack
    assert generate.with_matchers(edited, rows) == pack


def test_each_class_reaches_its_alert_and_unknown_codes_the_unknown_one() -> None:
    _, rows = generate.read_table(generate.TABLE.read_text())
    patterns = {a: generate.matcher(rows, op, c) for a, op, c in generate.MATCHED}
    unknown = re.fullmatch(r'xid!~"(.*)"', patterns["GpuXidUnknown"])
    assert unknown
    for code in range(1, 400):
        knows = re.fullmatch(unknown.group(1), str(code)) is not None
        assert knows == (code in CATALOG), code
    critical = re.fullmatch(r'xid=~"(.*)"', patterns["GpuXidCritical"])
    assert critical
    assert re.fullmatch(critical.group(1), "48")
    assert not re.fullmatch(critical.group(1), "79")  # GpuFellOffBus's
    assert lookup(79).holds_until_reset


@pytest.mark.parametrize("n", [9, 10, 99, 100, 172, 199, 200, 305, 999])
def test_the_range_pattern_matches_one_to_n(n: int) -> None:
    pattern = re.compile(generate.up_to(n))
    assert [k for k in range(0, 1200) if pattern.fullmatch(str(k))] == list(range(1, n + 1))


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("46\tcritical\tGPU timeout", "catalog.tsv:1: 3 tab-separated fields, not 4"),
        ("4x\tcritical\tGPU timeout\t@reset", "catalog.tsv:1: codes '4x'"),
        ("46\tfatal\tGPU timeout\tReset it.", "catalog.tsv:1: class 'fatal' is none of"),
        ("46\tcritical\tGPU timeout\t@nope", "catalog.tsv:1: action @nope is not named"),
        ("46\tinfo\ta\tb\n40-50\tinfo\tc\td", "catalog.tsv:2: XID 46 is in the table twice"),
    ],
)
def test_a_bad_table_line_is_named(line: str, error: str) -> None:
    with pytest.raises(generate.TableError, match=re.escape(error)):
        generate.read_table(line)
