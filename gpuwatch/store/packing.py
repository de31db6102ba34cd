"""A closed run's values packed losslessly into bytes, for the part of history rules no longer
read (gpuwatch.store.runs keeps the recent part as plain doubles).

NVML reports integers (milliwatts, MHz, bytes, percent) that the sampler scales by a power of
ten, so most runs are integers times 10^-k: packed as the integers' differences, which zlib
shrinks to a byte or two a sample (a temperature or a steady clock to almost nothing). Any other
run (NaN losses, pushed values with many digits) is packed as zlib over its doubles. A packing is
kept only if it unpacks to the same bits and is smaller; otherwise the run stays as it was.

Packing a 512-sample run takes 0.1-0.3 ms, unpacking it 20-50 us (in C but for the scaling):
packed runs are read by long range queries, not by each rule evaluation.
"""

from __future__ import annotations

import math
import zlib
from array import array
from itertools import accumulate, pairwise

LEVEL = 4  # zlib's default (6) saves under 1% more on these integers, at twice the time
MAX_DIGITS = 6  # 10^-6: microseconds, millionths; beyond that a value is not decimal data
PROBE = 16  # values a scaling is tried on before the whole run is
_LIMIT = 2**53  # integers a double holds exactly

_RAW = 0  # zlib over the doubles
_DIVIDED = 1  # integers i, value = i / 10^k
_MULTIPLIED = 2  # integers i, value = i * 10.0^-k (how the sampler scales: mW * 0.001)


def pack(values: array[float]) -> bytes | None:
    """The values packed, or None when packing would not save space."""
    raw = values.tobytes()
    scaled = _pack_scaled(values)
    if scaled is not None and len(scaled) < len(raw) and unpack(scaled).tobytes() == raw:
        return scaled  # (a -0.0 fails the last test: its integer is 0)
    packed = bytes((_RAW, 0)) + zlib.compress(raw, LEVEL)
    return packed if len(packed) < len(raw) else None


def unpack(packed: bytes) -> array[float]:
    kind, digits = packed[0], packed[1]
    body = zlib.decompress(packed[2:])
    if kind == _RAW:
        out = array("d")
        out.frombytes(body)
        return out
    steps = array("q")
    steps.frombytes(body)
    if digits == 0:
        return array("d", accumulate(steps))
    if kind == _DIVIDED:
        scale = 10**digits
        return array("d", [i / scale for i in accumulate(steps)])
    factor = 10.0**-digits
    return array("d", [i * factor for i in accumulate(steps)])


def _pack_scaled(values: array[float]) -> bytes | None:
    """The values as integer steps when each is an integer over a power of ten, else None."""
    first = values[0]
    if not math.isfinite(first):
        return None
    probe = values[:PROBE]
    for digits in range(MAX_DIGITS + 1):
        if abs(first) * 10**digits >= _LIMIT:
            return None  # more digits only make it larger
        # The first values name the candidate scalings; the whole run confirms one. Both may
        # hold for some values (0.5 is 500 / 1000 and 500 * 0.001): each is tried.
        for kind in (_DIVIDED, _MULTIPLIED):
            if _integers(probe, digits, kind) is None:
                continue
            ints = _integers(values, digits, kind)
            if ints is not None:
                steps = array("q", [ints[0]])
                steps.extend([b - a for a, b in pairwise(ints)])
                return bytes((kind, digits)) + zlib.compress(steps.tobytes(), LEVEL)
    return None


def _integers(values: array[float], digits: int, kind: int) -> list[int] | None:
    scale = 10**digits
    try:
        ints = [round(v * scale) for v in values]
    except (ValueError, OverflowError):  # NaN, infinity
        return None
    if max(ints) >= _LIMIT or min(ints) <= -_LIMIT:
        return None
    if kind == _DIVIDED:
        same = all(i / scale == v for i, v in zip(ints, values, strict=True))
    else:
        factor = 10.0**-digits
        same = all(i * factor == v for i, v in zip(ints, values, strict=True))
    return ints if same else None
