"""sort_by_label and sort_by_label_desc: label values in natural order, as Prometheus sorts
them (facette/natsort), then the whole label set."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from gpuwatch.promql.values import Vector, VSample

_CHUNK = re.compile(r"[0-9]+|[^0-9]+")


def natural_less(a: str, b: str) -> bool:
    """Prometheus's natural order of label values (facette/natsort): runs of digits compare
    as numbers, the rest as text; its quirks kept (an empty value is never less)."""
    chunks_a: list[str] = _CHUNK.findall(a)
    chunks_b: list[str] = _CHUNK.findall(b)
    for i, chunk_a in enumerate(chunks_a):
        if i >= len(chunks_b):
            return False
        chunk_b = chunks_b[i]
        both_numbers = _go_int(chunk_a) and _go_int(chunk_b)
        if both_numbers and int(chunk_a) != int(chunk_b):
            return int(chunk_a) < int(chunk_b)
        if not both_numbers and chunk_a != chunk_b:
            return chunk_a < chunk_b
        if i == len(chunks_a) - 1:
            return True
        if i == len(chunks_b) - 1:
            return False
    return False


def _go_int(chunk: str) -> bool:
    """A run of ASCII digits strconv.Atoi reads (it fails past int64)."""
    return chunk.isascii() and chunk.isdigit() and int(chunk) < 2**63


Keyed = tuple[tuple[str, ...], VSample]  # the named labels' values, and the sample


def _by_labels(descending: bool) -> Callable[[Keyed, Keyed], int]:
    sign = -1 if descending else 1

    def compare(x: Keyed, y: Keyed) -> int:
        for a, b in zip(x[0], y[0], strict=True):
            if a != b:
                return -sign if natural_less(a, b) else sign
        mx, my = x[1].metric, y[1].metric
        return sign * ((mx > my) - (mx < my))

    return compare


def sort_by_labels(vector: Vector, names: list[str], descending: bool) -> Vector:
    """The values of the named labels read once a sample, not once a comparison."""
    keyed: list[Keyed] = []
    for s in vector:
        labels = dict(s.metric)
        keyed.append((tuple(labels.get(name, "") for name in names), s))
    keyed.sort(key=functools.cmp_to_key(_by_labels(descending)))
    return [s for _, s in keyed]
