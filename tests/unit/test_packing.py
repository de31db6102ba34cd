"""Packed runs unpack to the same bits, and NVML's scaled integers pack small."""

from __future__ import annotations

import math
import random
import struct
from array import array

import pytest

from gpuwatch.store.packing import pack, unpack
from gpuwatch.store.series import STALE_NAN

N = 512
rng = random.Random(7)


def _runs() -> dict[str, list[float]]:
    watts = [rng.randrange(60_000, 700_000) * 0.001 for _ in range(N)]  # mW, as the sampler
    walk = [300_000 + rng.randrange(-5_000, 5_000)]
    for _ in range(N - 1):
        walk.append(walk[-1] + rng.randrange(-5_000, 5_000))
    return {
        "power at random (mW * 0.001)": watts,
        "temperature": [float(40 + i // 100) for i in range(N)],
        "power wandering (mW * 0.001)": [mw * 0.001 for mw in walk],
        "utilization (percent / 100)": [rng.randrange(0, 101) / 100 for _ in range(N)],
        "NVLink bytes": [float(10**14 + i * 25_000_000_123) for i in range(N)],
        "counter with a reset": [float(i if i < 300 else i - 300) for i in range(N)],
        "random doubles": [rng.random() * 1e6 for _ in range(N)],
        "NaN losses and a stale marker": [
            math.nan if i % 50 == 0 else STALE_NAN if i == 7 else float(i) for i in range(N)
        ],
        "negative zero": [-0.0 if i % 2 else 0.0 for i in range(N)],
        "infinities": [math.inf if i % 3 else -math.inf for i in range(N)],
        "huge and tiny": [1e300 if i % 2 else 5e-324 for i in range(N)],
        "integers beyond a double's": [float(2**60 + i * 2**10) for i in range(N)],
        "negative decimals": [-(i % 97) * 0.001 for i in range(N)],
        "mixed digits": [i / 7 if i % 5 else float(i) for i in range(N)],
    }


@pytest.mark.parametrize("kind", sorted(_runs()))
def test_a_packed_run_unpacks_to_the_same_bits(kind: str) -> None:
    values = array("d", _runs()[kind])
    packed = pack(values)
    if packed is not None:
        assert unpack(packed).tobytes() == values.tobytes()
        assert len(packed) < len(values.tobytes())


def test_a_stale_marker_keeps_its_payload() -> None:
    values = array("d", [1.0, STALE_NAN, math.nan, 2.0] * 128)
    packed = pack(values)
    assert packed is not None
    bits = [struct.pack("<d", v) for v in unpack(packed)]
    assert bits[1] == struct.pack("<d", STALE_NAN) != bits[2]


def test_nvml_readings_pack_to_a_fraction_of_their_doubles() -> None:
    runs = _runs()
    raw = N * 8
    sizes = {kind: len(pack(array("d", runs[kind])) or b"x" * raw) for kind in runs}
    assert sizes["temperature"] < raw / 50
    assert sizes["power at random (mW * 0.001)"] < raw / 2  # 19 bits of entropy a sample
    assert sizes["power wandering (mW * 0.001)"] < raw / 2.5
    assert sizes["utilization (percent / 100)"] < raw / 4  # at random: 7 bits a sample
    assert sizes["NVLink bytes"] < raw / 20  # a steady rate: the same step every sample
    assert sizes["negative decimals"] < raw / 10


def test_what_does_not_shrink_is_left_plain() -> None:
    noise = array("d", struct.unpack(f"<{N}d", rng.randbytes(N * 8)))
    noise = array("d", [v if math.isfinite(v) else 0.5 for v in noise])
    assert pack(noise) is None


def test_values_too_large_for_integers_pack_as_doubles_or_not_at_all() -> None:
    for values in ([1e303, 2e303] * 256, [1.0] * 300 + [1e303] * 212, [3e15 + i for i in range(N)]):
        run = array("d", values)
        packed = pack(run)
        assert packed is None or unpack(packed).tobytes() == run.tobytes()
