"""After a restart the XID counters come back with their history, so the shipped rules judge
them as if the daemon had never stopped: an old XID does not fire again, a recent one still
fires, for its remaining time only."""

from __future__ import annotations

from gpuwatch import metrics as m
from gpuwatch.model import Event, GpuInfo, GpuState, GpuStatus, Sample
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.store.tsdb import Store
from gpuwatch.xid.counter import OTHER, UNLISTED_PER_GPU, XidCounter, xid_history

NOW = 1_800_000_000.0
UUID = "GPU-1"


def xid(t: float, code: int) -> Event:
    return Event(t, "xid", 1, UUID, f"XID {code}", {"xid": code})


def restarted(events: list[Event]) -> RuleEngine:
    """A fresh store and engine, replayed from the journal, then one live cycle and a second."""
    engine = RuleEngine(Store(3600.0), None, 1.0, None)
    engine.load()
    for t, samples in xid_history(events, NOW, NOW - 3600.0):
        engine.store.ingest("nvml", t, samples)
    counts: dict[int, int] = {}
    for e in events:
        counts[int(e.data["xid"])] = counts.get(int(e.data["xid"]), 0) + 1
    for t in (NOW, NOW + 1.0):
        live = [
            Sample(m.XID_ERRORS, (("gpu", "1"), ("uuid", UUID), ("xid", str(c))), float(n))
            for c, n in counts.items()
        ]
        engine.store.ingest("nvml", t, live)
        engine.evaluate(t, everything=True)
    return engine


def firing(engine: RuleEngine) -> set[tuple[str, str]]:
    return {
        (a.name, dict(a.labels).get("xid", ""))
        for r in engine.alerting_rules()
        for a in r.active.values()
        if a.state.value == "firing"
    }


def test_an_xid_from_an_hour_ago_does_not_fire_again_after_a_restart() -> None:
    assert firing(restarted([xid(NOW - 3000.0, 48)])) == set()
    assert firing(restarted([xid(NOW - 7200.0, 79), xid(NOW - 5000.0, 79)])) == set()


def test_an_xid_from_two_minutes_ago_still_fires_after_a_restart() -> None:
    engine = restarted([xid(NOW - 3000.0, 48), xid(NOW - 120.0, 48)])
    assert firing(engine) == {("GpuXidCritical", "48")}


def test_the_replayed_counter_counts_every_event_of_the_boot() -> None:
    history = xid_history([xid(NOW - 9000.0, 13), xid(NOW - 60.5, 13)], NOW, NOW - 3600.0)
    assert history[0][0] == NOW - 3600.0
    assert [s.value for s in history[0][1]] == [1.0]  # the event before the window counts
    assert [s.value for s in history[-1][1]] == [2.0]
    assert all(t < NOW for t, _ in history)


def test_an_xid_of_a_gpu_without_an_index_is_replayed_on_no_series() -> None:
    """The kernel log's XID for a GPU the driver did not list knows its UUID but no index."""
    unlisted = Event(NOW - 60.0, "xid", None, "GPU-9", "XID 79 on GPU at 0000:3b:00.0", {"xid": 79})
    history = xid_history([xid(NOW - 120.0, 13), unlisted], NOW, NOW - 3600.0)
    labels = {s.labels for _, samples in history for s in samples}
    assert labels == {(("gpu", "1"), ("uuid", UUID), ("xid", "13"))}


def test_codes_past_the_numbered_ones_make_few_series_and_the_real_ones_always_count() -> None:
    counter = XidCounter()
    events = [xid(NOW - 600 + i, code) for i, code in enumerate(range(1000, 1040))]
    events += [xid(NOW - 500, 79), xid(NOW - 499, 1039)]
    counted = [counter.record(UUID, int(e.data["xid"])) for e in events]
    assert counted == [*range(1000, 1000 + UNLISTED_PER_GPU), *[OTHER] * 24, 79, OTHER]
    gpu = GpuState(GpuInfo(1, UUID, "H100", "0000:1b:00.0", "s", "v", 18), GpuStatus.OK)
    live = {dict(s.labels)["xid"]: s.value for s in counter.samples([gpu])}
    assert live == {**{str(c): 1.0 for c in range(1000, 1016)}, "79": 1.0, "other": 25.0}
    # Replayed after a restart, the same series with the same counts.
    [(_, replayed)] = [h for h in xid_history(events, NOW, NOW - 3600.0) if h[0] == NOW - 499]
    assert {dict(s.labels)["xid"]: s.value for s in replayed} == live
