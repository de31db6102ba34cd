from __future__ import annotations

import itertools
import math
import random
import struct
from array import array
from collections import deque

import pytest

from gpuwatch.model import Sample
from gpuwatch.store import packing, tsdb
from gpuwatch.store import runs as runs_module
from gpuwatch.store.runs import RUN_CAPACITY, RUN_SPAN_S
from gpuwatch.store.series import last_two
from gpuwatch.store.tsdb import PACK_PER_INGEST, Store

GPU0 = (("gpu", "0"), ("uuid", "GPU-a"))
GPU1 = (("gpu", "1"), ("uuid", "GPU-b"))


def _feed(store: Store, t: float, **values: float) -> None:
    store.ingest("nvml", t, [Sample(name, GPU0, v) for name, v in values.items()])


def test_history_is_left_open_and_right_closed() -> None:
    store = Store(retention=3600)
    for t in range(10):
        _feed(store, 100.0 + t, temp=float(t))
    (series,) = store.select("temp")
    assert series.samples(102.0, 105.0) == [(103.0, 3.0), (104.0, 4.0), (105.0, 5.0)]
    assert series.value_at(105.5) == 5.0
    assert series.value_at(99.0) is None  # nothing before the first sample
    assert series.value_at(109.0 + 301) is None  # beyond the 5 m lookback


def test_series_missing_from_a_batch_goes_stale_and_leaves_a_gap() -> None:
    store = Store(retention=3600)
    store.ingest("nvml", 1.0, [Sample("temp", GPU0, 50.0), Sample("temp", GPU1, 60.0)])
    store.ingest("nvml", 2.0, [Sample("temp", GPU0, 51.0)])  # GPU 1 stopped answering
    store.ingest("nvml", 3.0, [Sample("temp", GPU0, 52.0)])
    latest = {s.labels: s.last_value for s in store.latest(now=3.0)}
    assert latest == {GPU0: 52.0}
    (gpu1,) = store.select("temp", lambda s: s.label_dict["gpu"] == "1")
    assert gpu1.value_at(1.5) == 60.0
    assert gpu1.value_at(2.5) is None  # stale from the batch that lacked it, not 5 m later
    store.ingest("nvml", 4.0, [Sample("temp", GPU0, 53.0), Sample("temp", GPU1, 61.0)])
    assert gpu1.samples(0, 10) == [(1.0, 60.0), (4.0, 61.0)]
    assert gpu1.value_at(4.0) == 61.0


def test_each_value_lands_in_its_series_whatever_the_order_of_a_batch() -> None:
    """A source's series usually come in the same order; when they do not (a GPU gone, one
    new, the same names with other labels) each value still goes to its own series."""
    store = Store(retention=3600)
    batches = [
        [("temp", GPU0, 1.0), ("temp", GPU1, 2.0), ("power", GPU0, 3.0)],
        [("temp", GPU1, 12.0), ("temp", GPU0, 11.0), ("power", GPU0, 13.0)],  # swapped
        [("temp", GPU0, 21.0), ("power", GPU0, 23.0)],  # GPU 1 gone: shifted
        [("power", GPU0, 33.0), ("temp", GPU0, 31.0), ("temp", GPU1, 32.0), ("fan", GPU0, 34.0)],
    ]
    for t, batch in enumerate(batches):
        store.ingest("nvml", float(t), [Sample(*one) for one in batch])
    history = {(s.name, s.labels): s.samples(-1.0, 10.0) for s in store.select("temp")}
    history |= {(s.name, s.labels): s.samples(-1.0, 10.0) for s in store.select("power")}
    assert history == {
        ("temp", GPU0): [(0.0, 1.0), (1.0, 11.0), (2.0, 21.0), (3.0, 31.0)],
        ("temp", GPU1): [(0.0, 2.0), (1.0, 12.0), (3.0, 32.0)],  # stale at 2.0
        ("power", GPU0): [(0.0, 3.0), (1.0, 13.0), (2.0, 23.0), (3.0, 33.0)],
    }
    assert [s.value_at(3.0) for s in store.select("fan")] == [34.0]


def test_a_source_quiet_past_the_retention_starts_its_series_again() -> None:
    """Its series were dropped while it was quiet (a GPU's slow tier while the daemon was
    suspended); what it sends next is stored, not appended to the series dropped."""
    store = Store(retention=10)
    store.ingest("nvml/slow/gpu0", 0.0, [Sample("ecc", GPU0, 1.0)])
    store.ingest("nvml", 0.0, [Sample("temp", GPU0, 50.0)])
    store.ingest("nvml", 100.0, [Sample("temp", GPU0, 51.0)])  # the sweep drops ecc
    assert store.select("ecc") == []
    store.ingest("nvml/slow/gpu0", 101.0, [Sample("ecc", GPU0, 2.0)])
    assert [s.value_at(101.0) for s in store.select("ecc")] == [2.0]


def test_sources_do_not_mark_each_other_stale() -> None:
    store = Store(retention=3600)
    store.ingest("nvml", 1.0, [Sample("temp", GPU0, 50.0)])
    store.ingest("jobs", 1.5, [Sample("train_loss", (("job", "a"),), 2.0)])
    store.ingest("nvml", 2.0, [Sample("temp", GPU0, 50.0)])
    assert {s.name for s in store.latest(now=2.0)} == {"temp", "train_loss"}


def test_nan_values_are_kept_and_distinct_from_staleness() -> None:
    store = Store(retention=3600)
    _feed(store, 1.0, loss=math.nan)
    _feed(store, 2.0, loss=math.nan)
    (series,) = store.select("loss")
    value = series.value_at(2.0)
    assert value is not None and math.isnan(value)
    assert len(series.samples(0, 3)) == 2


def test_retention_drops_old_samples_and_dead_series() -> None:
    store = Store(retention=100)
    store.ingest("nvml", 0.0, [Sample("gone", GPU0, 1.0), Sample("temp", GPU0, 1.0)])
    for t in range(1, 1000):
        _feed(store, float(t), temp=float(t % 7))
    (series,) = store.select("temp")
    kept = series.samples(-1, 1000)
    assert kept[0][0] >= 999 - 100 - 64  # trimmed in sweeps, never far past the window
    assert kept[-1] == (999.0, 999 % 7)
    assert store.select("gone") == []
    assert len(store) == 1


def test_names_the_rules_read_back_further_are_kept_longer_than_the_rest() -> None:
    store = Store(retention=100)
    store.read_back_by_name = {"xid": 1000}
    for t in range(3000):
        _feed(store, float(t), temp=float(t % 7), xid=float(t // 3))
    (temp,) = store.select("temp")
    (xid,) = store.select("xid")
    # Trimmed in whole runs of RUN_CAPACITY samples, in sweeps a minute apart.
    assert temp.samples(-1, 3000)[0][0] >= 2999 - 100 - RUN_CAPACITY - 60
    assert 2999 - 1000 - RUN_CAPACITY - 60 <= xid.samples(-1, 3000)[0][0] <= 2999 - 1000


def test_a_constant_series_is_one_run_and_varying_ones_pack_values() -> None:
    store = Store(retention=10_000)
    for t in range(1000):
        _feed(store, float(t), limit=700.0, temp=float(t % 5))
    (limit,) = store.select("limit")
    (temp,) = store.select("temp")
    assert len(limit.runs) == 1 and limit.runs[0].values is None
    assert len(temp.runs) == math.ceil(1000 / min(RUN_CAPACITY, RUN_SPAN_S))  # one a second
    assert all(run.values is not None or run.packed is not None for run in temp.runs)
    assert [v for _, v in temp.samples(994.5, 999)] == [0.0, 1.0, 2.0, 3.0, 4.0]


def _same(a: object, b: object) -> bool:
    return repr(a) == repr(b)  # NaNs compare equal by their text


def test_packed_history_reads_as_it_was_written() -> None:
    """Runs older than anything the rules read are packed: every read over them, or across
    packed and plain runs, answers as a store that never packs."""
    packed, plain = Store(retention=3600), Store(retention=3600, pack_after=math.inf)
    rng = random.Random(3)
    for t in range(3000):
        batch = [
            Sample("bytes", GPU0, float(t * 25_000_123 if t < 1500 else (t - 1500) * 7)),
            Sample("temp", GPU0, float(40 + t // 300)),
            Sample("lossy", GPU0, math.nan if t % 97 == 0 else t * 0.01),
            Sample("noise", GPU0, rng.random()),
        ]
        if not 700 <= t < 760:  # a minute without power: a stale marker and a gap
            batch.append(Sample("power", GPU0, rng.randrange(60_000, 700_000) * 0.001))
        for store in (packed, plain):
            store.ingest("nvml", float(t), batch)
    assert sum(run.packed is not None for s in packed.select(None) for run in s.runs) >= 15
    windows = [(-1, 3000), (100, 400), (500, 1700), (1400, 1600), (2000, 2999), (2990, 2999)]
    for name in ("bytes", "temp", "lossy", "noise", "power"):
        (a,) = packed.select(name)
        (b,) = plain.select(name)
        for start, end in windows:
            assert _same(a.samples(start, end), b.samples(start, end)), (name, start, end)
            assert _same(a.counter_stats(start, end), b.counter_stats(start, end)), name
            wa, wb = a.window(start, end), b.window(start, end)
            assert _same((wa.first(), wa.last(), wa.drops()), (wb.first(), wb.last(), wb.drops()))
        for t in (10.5, 699.0, 730.0, 1500.0, 2999.0):
            assert _same(a.point_at(t), b.point_at(t)), (name, t)


def test_the_last_two_samples_are_a_windows_last_two() -> None:
    """irate's read, straight from the runs: across constant, varying and packed runs, stale
    markers, batches a series was missing from, and windows holding fewer than two."""
    stores = Store(retention=3600), Store(retention=3600, pack_after=math.inf)
    rng = random.Random(5)
    for t in range(2400):
        batch = [Sample("steady", GPU0, float(t // 700))]  # constant runs
        if rng.random() < 0.9:  # missing from a tenth of the batches: stale markers
            batch.append(Sample("bytes", GPU0, float(t * 1000 + rng.randrange(100))))
        for store in stores:
            store.ingest("nvml", float(t), batch)
    assert any(r.packed is not None for s in stores[0].select(None) for r in s.runs)
    ends = [rng.uniform(-5, 2405) for _ in range(300)] + [0.0, 1.0, 699.0, 700.0, 2399.0]
    for store in stores:
        for name in ("steady", "bytes"):
            (series,) = store.select(name)
            for end in ends:
                for length in (0.5, 1.0, 2.0, 3.0, 60.0):
                    start = end - length
                    got = series.last_two(start, end)
                    assert _same(got, last_two(series.window(start, end))), (name, start, end)


def test_what_the_rules_read_back_stays_plain() -> None:
    store = Store(retention=3600)
    store.read_back_by_name = {"power": 2000.0}
    for t in range(3000):
        _feed(store, float(t), power=t * 0.5, temp=t * 0.25)
    (power,) = store.select("power")
    (temp,) = store.select("temp")
    [newest_packed] = [r.end for r in power.runs if r.packed is not None][-1:]
    assert store._timelines["nvml"].time(newest_packed - 1) < 2999 - 2000
    assert any(run.packed is not None for run in temp.runs[-4:])


def test_a_sweep_packs_its_runs_a_few_a_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tsdb, "PACK_BUDGET_S", math.inf)  # a busy machine's time is no limit
    store = Store(retention=3600)
    packed_after: list[int] = []
    for t in range(1500):
        gpus = [Sample("temp", (("gpu", str(g)),), t * 0.5 + g) for g in range(40)]
        store.ingest("nvml", float(t), gpus)
        packed_after.append(sum(r.packed is not None for s in store.select("temp") for r in s.runs))
    steps = [b - a for a, b in itertools.pairwise(packed_after)]
    assert max(steps) == PACK_PER_INGEST  # a sweep found more than one batch packs
    assert packed_after[-1] == 40 * 2  # each GPU's two runs that ended over 5 minutes ago


def test_what_waits_to_be_packed_can_be_packed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tsdb, "PACK_BUDGET_S", math.inf)
    store = Store(retention=3600)
    for t in range(841):  # the sweep at 840 s finds the runs that closed 5 minutes before
        gpus = [Sample("temp", (("gpu", str(g)),), t * 0.5 + g) for g in range(40)]
        store.ingest("nvml", float(t), gpus)
    packed = sum(r.packed is not None for s in store.select("temp") for r in s.runs)
    assert packed == PACK_PER_INGEST  # the sweep's batch packed its few; the rest wait
    store.pack_waiting()
    assert sum(r.packed is not None for s in store.select("temp") for r in s.runs) == 40


def test_a_run_is_packed_once_and_a_run_gone_is_not_kept_for_packing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that packing would not shrink (a job's random doubles) is not tried at every
    sweep; runs that retention dropped before their turn are let go, not packed."""
    tried: list[array[float]] = []  # held, so that no two share an id

    def counting(values: array[float]) -> bytes | None:
        tried.append(values)
        return packing.pack(values)

    monkeypatch.setattr(runs_module, "pack", counting)
    store = Store(retention=900)
    rng = random.Random(5)
    for t in range(3000):
        noise = struct.unpack("<30d", rng.randbytes(240))  # nothing zlib can shrink
        jobs = [
            Sample("loss", (("rank", str(r)),), v) for r, v in enumerate(noise) if not math.isnan(v)
        ]
        store.ingest("push", float(t), jobs if t < 1500 else [])
        _feed(store, float(t), temp=t * 0.5)
    assert len(tried) == len({id(values) for values in tried}) > 30  # each run once
    assert store.select("loss") == []  # gone with retention
    assert store._to_pack == deque()  # nothing held for them


def test_a_run_that_cannot_be_packed_stays_and_ingest_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(values: array[float]) -> bytes | None:
        raise OverflowError("a bug in packing")

    monkeypatch.setattr(runs_module, "pack", broken)
    store = Store(retention=3600)
    for t in range(1500):
        _feed(store, float(t), temp=t * 0.5)
    (temp,) = store.select("temp")
    assert [v for _, v in temp.samples(-1, 1)] == [0.0, 0.5]
    assert all(run.packed is None for run in temp.runs)
