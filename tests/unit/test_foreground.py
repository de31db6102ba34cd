"""Rule evaluation steps aside for a /metrics page being written: where it asks to, how long it
may wait in all, and that reading in steps changes no answer. The waiting itself, on real
threads, is tests/integration/test_foreground.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import promql_parser as pp
import pytest
from gpuwatch.exporters.prometheus import MetricsRenderer

from gpuwatch import metrics as m
from gpuwatch.clock import ManualClock
from gpuwatch.metrics import MetricDef
from gpuwatch.model import Sample
from gpuwatch.promql.evaluator import PACE_EVERY, Evaluator
from gpuwatch.promql.memory import MemoryStorage
from gpuwatch.promql.values import RangeSeries
from gpuwatch.rules.engine import STEP_ASIDE_S, RuleEngine
from gpuwatch.store.tsdb import Store
from gpuwatch.web.foreground import Foreground, StepAside

T0 = 1_700_000_000.0


class Claims:
    """A step_aside that takes no time but says it waited: the next of `claims` each time (the
    last again once they run out), at most what it was allowed unless `beyond`; it records
    what it was allowed each time."""

    def __init__(self, *claims: float, beyond: bool = False) -> None:
        self.claims = list(claims)
        self.beyond = beyond
        self.allowed: list[float] = []

    def __call__(self, at_most: float) -> float:
        claim = self.claims[min(len(self.allowed), len(self.claims) - 1)]
        self.allowed.append(at_most)
        return claim if self.beyond else min(claim, at_most)


def test_nothing_served_is_no_wait() -> None:
    foreground = Foreground()
    assert not foreground.busy
    assert foreground.step_aside(10.0) == 0.0
    with foreground.serving():
        assert foreground.busy
        with foreground.serving():  # two pages at once
            assert foreground.busy
        assert foreground.busy  # one is still being written
        assert foreground.step_aside(0.0) == 0.0  # no time left to wait
    assert not foreground.busy


def test_an_evaluation_waits_at_most_its_share_in_all() -> None:
    claims = Claims(0.375)
    aside = StepAside(claims, 1.0)
    assert [aside() for _ in range(5)] == [0.375, 0.375, 0.25, 0.0, 0.0]
    assert claims.allowed == [1.0, 0.625, 0.25]  # not asked once the share is spent
    assert aside.waited == 1.0
    aside.renew()
    assert (aside.left, aside.waited) == (1.0, 0.0)
    assert aside() == 0.375


def _storage(series: int) -> MemoryStorage:
    store = MemoryStorage()
    for i in range(series):
        one = store.series((("__name__", "x"), ("gpu", str(i))))
        for step in range(7):
            one.add(T0 + 10 * step, float(i * step))
    return store


def _plain(value: object) -> object:
    """A range vector's windows as lists, which compare; any other value as it is."""
    if isinstance(value, list) and value and isinstance(value[0], RangeSeries):
        return [(r.metric, list(r.window.times()), list(r.window.values())) for r in value]
    return value


def test_pace_is_called_each_time_a_step_of_series_has_been_read() -> None:
    """Counted across selections, and before the series after the step's last is read."""
    read: list[object] = []
    asks: list[int] = []
    ev = Evaluator(MemoryStorage(), pace=lambda: asks.append(len(read)))
    # 600 read (two asks within), then to 768 exactly, then one more: that one asks first.
    for size in (600, 100, 68, 1, 255, 1):
        read.extend(ev.paced(list(range(size))))  # type: ignore[arg-type]
    assert asks == [256, 512, 768, 1024]
    assert len(read) == 1025  # every series, once, in order
    assert read[:600] == list(range(600))


def test_small_selections_ask_as_often_as_one_large_one() -> None:
    paces: list[None] = []
    ev = Evaluator(_storage(64), pace=lambda: paces.append(None))
    for _ in range(9):  # 576 series read, 64 at a time
        ev.eval(pp.parse("x"), T0 + 60)
    assert len(paces) == 2


def test_reading_in_steps_changes_no_answer() -> None:
    store = _storage(3 * PACE_EVERY + 1)
    paces: list[None] = []
    paced = Evaluator(store, pace=lambda: paces.append(None))
    plain = Evaluator(store)
    t = T0 + 60
    exprs = ("x", "rate(x[1m])", "irate(x[1m])", "max_over_time(x[1m])", "x[1m]", "sum(x)")
    for expr in exprs:
        got, want = paced.eval(pp.parse(expr), t), plain.eval(pp.parse(expr), t)
        assert _plain(got) == _plain(want), expr
    assert len(paces) == len(exprs) * (3 * PACE_EVERY + 1) // PACE_EVERY


def _evaluate(engine: RuleEngine, t: float) -> None:
    """As the daemon's cycle has it evaluated (off the event loop), on this thread."""
    engine.commit(t, *engine.compute(t, everything=False))


RULES = """\
groups:
  - name: many
    rules:
      - record: x:sum
        expr: sum(x)
      - record: x:rate
        expr: sum(rate(x[1m]))
      - alert: Many
        expr: count(x) > 1
"""


def _engine(tmp_path: Path, claims: Claims) -> tuple[RuleEngine, Store]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    store = Store(3600)
    engine = RuleEngine(store, [str(rules)], 15.0, None, step_aside=claims)
    engine.load()
    return engine, store


def test_rules_step_aside_between_rules_and_within_a_selection(tmp_path: Path) -> None:
    claims = Claims(0.0)
    engine, store = _engine(tmp_path, claims)
    for step in range(7):
        samples = [Sample("x", (("gpu", str(i)),), float(i * step)) for i in range(600)]
        store.ingest("nvml", T0 + 10 * step, samples)
    _evaluate(engine, T0 + 60)
    # Three rules, each reading 600 series: one ask before each, and one each PACE_EVERY
    # series read (1800 // 256).
    assert len(claims.allowed) == 3 + 7
    assert claims.allowed[0] == STEP_ASIDE_S
    (recorded,) = engine.recorded.select("x:sum")
    assert recorded.last_value == sum(6.0 * i for i in range(600))


def test_an_evaluation_on_the_callers_thread_never_steps_aside(tmp_path: Path) -> None:
    claims = Claims(0.0)
    engine, store = _engine(tmp_path, claims)
    store.ingest("nvml", T0, [Sample("x", (("gpu", str(i)),), 1.0) for i in range(600)])
    engine.evaluate(T0)  # what a caller on the event loop would use
    assert claims.allowed == []


def test_time_spent_aside_is_not_the_rules_own(tmp_path: Path) -> None:
    """The first ask (before the first rule) claims nothing, the second (within the first
    rule's selection) claims far more than any evaluation takes: the group's and that rule's
    durations leave the claim out, and report no time of their own."""
    engine, store = _engine(tmp_path, Claims(0.0, 1000.0, 0.0, beyond=True))
    store.ingest("nvml", T0, [Sample("x", (("gpu", str(i)),), 1.0) for i in range(600)])
    _evaluate(engine, T0)
    group = engine.groups[0]
    assert group.evaluation_seconds == 0.0
    assert group.rules[0].status.evaluation_seconds == 0.0
    assert 0.0 < group.rules[1].status.evaluation_seconds < 1000.0


async def test_a_page_is_written_while_serving_and_a_cached_one_is_not() -> None:
    entered: list[str] = []

    @contextmanager
    def serving() -> Iterator[None]:
        entered.append("page")
        yield

    clock = ManualClock(T0)
    store = Store(3600)
    store.ingest("nvml", clock.now(), [Sample(m.TEMPERATURE, (("gpu", "0"),), 61.0)])
    renderer = MetricsRenderer(store, clock, serving=serving)
    await renderer.render(openmetrics=False, gzipped=False)
    assert entered == ["page"]
    await renderer.render(openmetrics=False, gzipped=False)  # the same cycle: cached
    assert entered == ["page"]
    await renderer.render(openmetrics=False, gzipped=True)  # compressed once
    assert entered == ["page", "page"]


async def test_a_page_cancelled_or_failed_while_written_is_served_no_longer() -> None:
    foreground = Foreground()
    clock = ManualClock(T0)
    store = Store(3600)
    store.ingest("nvml", clock.now(), [Sample(m.TEMPERATURE, (("gpu", "0"),), 61.0)])
    renderer = MetricsRenderer(store, clock, serving=foreground.serving)
    task = asyncio.create_task(renderer.render(openmetrics=False, gzipped=False))
    await asyncio.sleep(0)  # the render runs to its worker thread's await
    assert foreground.busy
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not foreground.busy

    def broken(name: str) -> MetricDef | None:
        raise RuntimeError(name)

    failing = MetricsRenderer(store, clock, broken, foreground.serving)
    with pytest.raises(RuntimeError):
        await failing.render(openmetrics=False, gzipped=False)
    assert not foreground.busy
