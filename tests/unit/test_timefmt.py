"""RFC 3339 as other programs write it: Go's nanoseconds (Alertmanager, Prometheus), a `Z` or
an offset, no zone at all (UTC), on every Python gpuwatch runs on (3.10 reads only 3 or 6
fractional digits by itself)."""

from __future__ import annotations

import pytest

from gpuwatch.text.timefmt import parse_rfc3339, rfc3339

T = 1_795_885_678.5


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-28T17:07:58.5Z",
        "2026-11-28T17:07:58.500000000Z",
        "2026-11-28T17:07:58.50000z",
        "2026-11-28T18:07:58.5+01:00",
        "2026-11-28T17:07:58.5",
        " 2026-11-28T17:07:58.500Z ",
    ],
)
def test_rfc3339_as_written_elsewhere(text: str) -> None:
    assert parse_rfc3339(text) == T


def test_what_we_write_reads_back() -> None:
    assert parse_rfc3339(rfc3339(T) or "") == T


@pytest.mark.parametrize("text", ["yesterday", "2026-13-01T00:00:00Z", "17:07:58Z"])
def test_what_is_no_time_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rfc3339(text)
