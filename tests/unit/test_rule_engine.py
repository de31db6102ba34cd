"""The rules engine in the daemon: alert state across restarts and reloads."""

from __future__ import annotations

import json
from pathlib import Path

from gpuwatch.model import Sample
from gpuwatch.rules.alerting import AlertState
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.rules.views import alerts_payload
from gpuwatch.store.tsdb import Store

T0 = 1_700_000_000.0

RULES = """\
groups:
  - name: test
    rules:
      - alert: EccStorm
        expr: ecc_rate > 10
        for: 5m
        labels:
          severity: critical
        annotations:
          summary: "GPU {{ $labels.gpu }} at {{ $value }}"
"""


def engine_for(rules: Path, state: Path) -> RuleEngine:
    engine = RuleEngine(Store(3600), [str(rules)], 1.0, state)
    engine.load()
    return engine


def feed(engine: RuleEngine, start: float, end: float, value: float) -> list[str]:
    """Sample `ecc_rate` every 10 s and evaluate after each; the transitions, in order."""
    seen = []
    t = start
    while t <= end:
        engine.store.ingest("nvml", t, [Sample("ecc_rate", (("gpu", "3"),), value)])
        for tr in engine.evaluate(t):
            seen.append(f"{tr.rule} {tr.old.value}->{tr.new.value} at +{tr.time - T0:.0f}s")
        t += 10
    return seen


def states(engine: RuleEngine) -> list[tuple[str, float]]:
    return [
        (a.state.value, a.active_at) for r in engine.alerting_rules() for a in r.active.values()
    ]


def test_a_pending_alert_fires_on_schedule_after_a_restart(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    first = engine_for(rules, tmp_path)
    assert feed(first, T0, T0 + 120, 50.0) == []
    assert states(first) == [("pending", T0)]

    # Restart: a new engine with an empty store, 60 s later. The alert is still pending since
    # T0, so it fires 5 minutes after T0, not 5 minutes after the restart.
    second = engine_for(rules, tmp_path)
    assert states(second) == [("pending", T0)]
    assert feed(second, T0 + 180, T0 + 400, 50.0) == ["EccStorm pending->firing at +300s"]


def test_a_firing_alert_does_not_fire_again_after_a_restart(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    first = engine_for(rules, tmp_path)
    assert feed(first, T0, T0 + 310, 50.0) == ["EccStorm pending->firing at +300s"]

    second = engine_for(rules, tmp_path)
    assert states(second) == [("firing", T0)]
    assert feed(second, T0 + 320, T0 + 400, 50.0) == []
    assert feed(second, T0 + 410, T0 + 420, 0.0) == ["EccStorm firing->inactive at +410s"]
    saved = json.loads((tmp_path / "alerts.json").read_text())
    [alert] = next(iter(saved["rules"].values()))
    assert alert["state"] == "inactive"
    assert alert["resolved_at"] == T0 + 410


def test_a_pending_alert_that_clears_while_down_is_dropped_silently(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    first = engine_for(rules, tmp_path)
    feed(first, T0, T0 + 60, 50.0)
    second = engine_for(rules, tmp_path)
    assert feed(second, T0 + 600, T0 + 700, 1.0) == []
    assert states(second) == []


def test_a_bad_file_on_reload_keeps_the_old_rules_evaluating(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    engine = engine_for(rules, tmp_path)
    feed(engine, T0, T0 + 310, 50.0)

    rules.write_text(RULES.replace("ecc_rate > 10", "histogram_count(ecc_rate) > 10"))
    error = engine.reload()
    assert error == (
        f'{rules}:5:15: group "test" alert "EccStorm": expr: '
        "unsupported in gpuwatch's PromQL subset: function histogram_count()"
    )
    assert engine.last_reload_error == error
    # The old rule still runs: the alert keeps firing, and it resolves when the value drops.
    feed(engine, T0 + 320, T0 + 330, 50.0)
    assert [a["state"] for a in alerts_payload(engine)["alerts"]] == ["firing"]
    reload_ok = engine.store.select("gpuwatch_rules_last_reload_successful")[0]
    assert reload_ok.last_value == 0.0
    assert feed(engine, T0 + 340, T0 + 340, 0.0) == ["EccStorm firing->inactive at +340s"]


def test_a_good_reload_keeps_the_state_of_rules_that_stay(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    engine = engine_for(rules, tmp_path)
    feed(engine, T0, T0 + 310, 50.0)
    rules.write_text(RULES.replace("at {{ $value }}", "is at {{ $value }}/s"))
    assert engine.reload() == ""
    [group] = engine.groups
    assert group.last_evaluation == T0 + 310  # the group keeps its schedule
    assert feed(engine, T0 + 320, T0 + 320, 50.0) == []  # still firing: no second page
    [alert] = alerts_payload(engine)["alerts"]
    assert alert["annotations"] == {"summary": "GPU 3 is at 50/s"}
    assert alert["state"] == AlertState.FIRING.value


def test_firing_alerts_are_exported_as_gpuwatch_alerts(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    engine = engine_for(rules, tmp_path)
    feed(engine, T0, T0 + 310, 50.0)
    # The pending series went stale when the alert fired, as Prometheus's ALERTS does.
    [series] = [s for s in engine.store.select("gpuwatch_alerts") if not s.stale]
    assert dict(series.labels) == {
        "alertname": "EccStorm",
        "alertstate": "firing",
        "gpu": "3",
        "severity": "critical",
    }
    assert engine.store.select("ecc_rate") and not engine.store.select("EccStorm")


def test_the_store_keeps_what_the_rules_read_back_and_an_xid_alert_does_not_flap(
    tmp_path: Path,
) -> None:
    """store.retention 10m with a rule that looks 10m back (the XID packs' `offset 10m`):
    the store keeps that series 15m and an interval, the others 10m. With only 10m, each
    retention sweep left nothing at or before `offset 10m`, the series looked new for one
    evaluation, and the alert fired and resolved again every sweep (the soak's flapping XID
    alerts)."""
    rules = tmp_path / "xid.yaml"
    rules.write_text(
        "groups:\n  - name: xid\n    rules:\n      - alert: NewXid\n        expr: |\n"
        "          increase(xid_total[10m]) > 0 or (xid_total unless xid_total offset 10m)\n"
    )
    store = Store(retention=600)
    engine = RuleEngine(store, [str(rules)], 15.0, None)
    engine.load()
    assert store.retention == 600
    # Kept, and unpacked, that far: offset, lookback, interval.
    assert store.read_back_by_name == {"xid_total": 600 + 300 + 15}
    transitions = []
    # 40 minutes, a cycle every 14.7 s (so no sample sits exactly at a trim's cutoff, as on a
    # real node); the XID counter appears at minute 1.
    for step in range(163):
        t = T0 + step * 14.7
        store.ingest("nvml", t, [Sample("xid_total", (("gpu", "3"),), 1.0)] if step >= 4 else [])
        transitions += [(x.rule, x.new) for x in engine.evaluate(t, everything=True)]
    assert transitions == [("NewXid", AlertState.FIRING), ("NewXid", AlertState.INACTIVE)]


BLIND_RULES = """\
groups:
  - name: blind
    rules:
      - alert: GpuLost
        expr: gpuwatch_gpu_lost == 1
      - alert: JobSaysLost
        expr: job_gpu_lost == 1
"""


def test_a_gpus_alert_holds_while_the_backend_is_down_and_a_jobs_does_not(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(BLIND_RULES)
    engine = RuleEngine(Store(3600), [str(rules)], 1.0, None)
    engine.load()
    gpu = (("gpu", "3"), ("uuid", "GPU-3"))
    engine.store.ingest("nvml", T0, [Sample("gpuwatch_gpu_lost", gpu, 1.0)])
    engine.store.ingest("push", T0, [Sample("job_gpu_lost", gpu, 1.0)])
    fired = engine.evaluate(T0)
    assert sorted((t.rule, t.new.value) for t in fired) == [
        ("GpuLost", "firing"),
        ("JobSaysLost", "firing"),
    ]
    # Both sources stop: the backend is down (blind), and the job's series ends.
    engine.store.ingest("nvml", T0 + 10, [])
    engine.store.ingest("push", T0 + 10, [])
    for t in (T0 + 10, T0 + 20, T0 + 30):
        changed = engine.evaluate(t, blind=True)
        assert [(c.rule, c.new.value) for c in changed] == (
            [("JobSaysLost", "inactive")] if t == T0 + 10 else []
        )
    # The backend back and the GPU still lost: the alert never resolved, and fires on.
    engine.store.ingest("nvml", T0 + 40, [Sample("gpuwatch_gpu_lost", gpu, 1.0)])
    assert engine.evaluate(T0 + 40) == []
    # Back and the GPU there again: now it resolves.
    engine.store.ingest("nvml", T0 + 50, [Sample("gpuwatch_gpu_lost", gpu, 0.0)])
    assert [(c.rule, c.new.value) for c in engine.evaluate(T0 + 50)] == [("GpuLost", "inactive")]
