"""The rules' evaluation waits, on a real thread, while a /metrics page is written, and for no
longer than its share: real threads and time, so not a unit test."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from gpuwatch.model import Sample
from gpuwatch.rules.engine import STEP_ASIDE_S, RuleEngine
from gpuwatch.store.tsdb import Store
from gpuwatch.web.foreground import Foreground

T0 = 1_700_000_000.0
RULES = """\
groups:
  - name: two
    rules:
      - record: x:sum
        expr: sum(x)
      - record: x:max
        expr: max(x)
"""


def _hold(foreground: Foreground, seconds: float, entered: threading.Event) -> None:
    with foreground.serving():
        entered.set()
        time.sleep(seconds)


def test_a_step_aside_waits_until_the_page_is_written() -> None:
    foreground = Foreground()
    entered = threading.Event()
    writer = threading.Thread(target=_hold, args=(foreground, 0.2, entered))
    writer.start()
    assert entered.wait(5.0)
    waited = foreground.step_aside(10.0)
    writer.join(5.0)
    assert 0.1 < waited < 5.0  # returned when the page was done, not at the bound
    assert not foreground.busy


def test_a_page_that_never_ends_holds_an_evaluation_back_by_its_share(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    store = Store(3600)
    foreground = Foreground()
    engine = RuleEngine(store, [str(rules)], 15.0, None, step_aside=foreground.step_aside)
    engine.load()
    store.ingest("nvml", T0, [Sample("x", (("gpu", str(i)),), float(i)) for i in range(8)])
    entered = threading.Event()
    writer = threading.Thread(target=_hold, args=(foreground, 2.0, entered), daemon=True)
    writer.start()
    assert entered.wait(5.0)
    started = time.monotonic()
    engine.commit(T0, *engine.compute(T0, everything=False))  # as in the daemon's worker
    took = time.monotonic() - started
    assert STEP_ASIDE_S * 0.9 <= took < 1.5  # its share, not the page's two seconds
    (recorded,) = engine.recorded.select("x:max")
    assert recorded.last_value == 7.0
    # What it waited is not the group's own time.
    assert engine.groups[0].evaluation_seconds < STEP_ASIDE_S * 0.9
    # The next evaluation has a share of its own.
    started = time.monotonic()
    engine.commit(T0 + 15, *engine.compute(T0 + 15, everything=False))
    assert time.monotonic() - started >= STEP_ASIDE_S * 0.9
    writer.join(5.0)
