"""Rule files tried on recorded history, over a history handed in as raw samples: when each
alert pended and fired, read a chunk at a time."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from gpuwatch.cli import main
from gpuwatch.clients.backtest import report
from gpuwatch.promql.values import Labels
from gpuwatch.rules.backtest import Backtest, Fetched, Interval, selections
from gpuwatch.rules.files import load_rule_file

T0 = 1_790_000_000.0 - 1_790_000_000.0 % 3600  # on the hour
RULES = """
groups:
  - name: g
    interval: 1m
    rules:
      - alert: Hot
        expr: temp{gpu!="9"} > 85
        for: 3m
  - name: slow
    interval: 2m
    rules:
      - alert: Lost
        expr: absent(temp{gpu="1"})
"""
HOT = (("__name__", "temp"), ("gpu", "1"), ("instance", "n1:10040"))


class History:
    """Raw samples every 15 s, 7 s into each step; `temp` of GPU 1 is 90 in [20m, 40m) and
    gone in [60m, 70m). Each fetch is noted."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, float, float]] = []

    def __call__(self, selector: str, start: float, end: float) -> Fetched:
        self.asked.append((selector, start, end))
        points = []
        for k in range(0, 6 * 240):
            t = T0 + 7 + 15 * k
            minute = (t - T0) / 60
            if start < t <= end and not 60 <= minute < 70:
                points.append((t, 90.0 if 20 <= minute < 40 else 60.0))
        return [(HOT, points)] if points else []


def backtest(tmp_path: Path, chunk: float = 3600.0) -> tuple[list[Interval], History]:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    history = History()
    found = Backtest(load_rule_file(str(path)), history, chunk=chunk).run(T0, T0 + 5400)
    return found, history


def spans(found: list[Interval]) -> list[tuple[str, str, float, float | None]]:
    return [(i.alertname, i.state, (i.start - T0) / 60, i.end and (i.end - T0) / 60) for i in found]


def test_each_alert_pends_and_fires_when_its_rule_says(tmp_path: Path) -> None:
    found, _ = backtest(tmp_path)
    assert spans(found) == [
        ("Lost", "firing", 0.0, 2.0),  # before the first sample, 7 s in
        # the first hot sample (20m07s) is read at 21m; 3 minutes pending
        ("Hot", "pending", 21.0, 24.0),
        ("Hot", "firing", 24.0, 41.0),
        # absent() once the last sample (59m52s) is 5 minutes old, in a group run every 2
        # minutes, until the first sample back (70m07s) is read at 72m
        ("Lost", "firing", 66.0, 72.0),
    ]
    assert found[2].labels == (("alertname", "Hot"), ("gpu", "1"), ("instance", "n1:10040"))


def test_a_shorter_chunk_reads_the_same_history_and_says_the_same(tmp_path: Path) -> None:
    long, _ = backtest(tmp_path)
    short, history = backtest(tmp_path, chunk=600.0)
    assert short == long
    # Each selector's history is read once, in spans that follow each other from the rules'
    # reach (5 minutes of lookback) before the start.
    for selector in ('temp{gpu!="9"}', 'temp{gpu="1"}'):
        asked = [(s, e) for sel, s, e in history.asked if sel == selector]
        assert asked[0][0] == T0 - 300
        assert all(a[1] == b[0] for a, b in pairwise(asked))
        assert asked[-1][1] == T0 + 5400


def test_an_alert_still_firing_at_the_end_has_no_end(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    found = Backtest(load_rule_file(str(path)), History()).run(T0, T0 + 30 * 60)
    assert spans(found)[-1] == ("Hot", "firing", 24.0, None)


def test_selectors_are_asked_as_written_with_how_far_back_they_read(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    expr = r'rate(x_total{a="q\"uote"}[10m] offset 5m) > 0 or {__name__=~"y|z"}'
    path.write_text(f"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: '{expr}'\n")
    assert selections(load_rule_file(str(path))) == {
        'x_total{a="q\\"uote"}': 900.0,
        '{__name__=~"y|z"}': 300.0,  # an instant selector: the lookback
    }


def test_the_report_names_each_node_and_the_time_each_alert_fired() -> None:
    labels: Labels = (("alertname", "Hot"), ("gpu", "1"), ("instance", "n1:10040"))
    found = [
        Interval(labels, "pending", T0, T0 + 180),
        Interval(labels, "firing", T0 + 180, T0 + 4980),
        Interval(labels, "firing", T0 + 6000, None),
    ]
    lines = report(found, T0, T0 + 7200, 1234).splitlines()
    assert lines[0].endswith("UTC: 1234 samples read; 2 firing intervals of 1 alerts on 1 nodes")
    assert lines[2] == "Hot: 2 intervals on 1 nodes"
    assert lines[3].split()[0] == "n1:10040"
    assert lines[3].endswith(' 1h20m  gpu="1"')
    assert "(still firing)" in lines[4] and lines[4].endswith(' 20m  gpu="1"')


def test_a_span_that_ends_before_it_starts_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    argv = ["rules", "backtest", str(path), "--prometheus", "http://127.0.0.1:9"]
    assert main([*argv, "--from", "1h", "--to", "2h"]) == 2
    assert "is not after --from" in capsys.readouterr().err
    assert main([*argv, "--from", "yesterday"]) == 2
    assert "expected a duration (1h), an RFC 3339 time or Unix seconds" in capsys.readouterr().err
    assert main([*argv, "--from", "2h", "--interval", "0s"]) == 2
    assert "--interval and --chunk must be longer than 0s" in capsys.readouterr().err
    assert main([*argv, "--from", "2h", "--to", "4000000000"]) == 2  # in 2096
    assert "is in the future: Prometheus has no history there" in capsys.readouterr().err
    argv[-1] = "127.0.0.1:9090"
    assert main([*argv, "--from", "2h"]) == 2
    assert "expected an http:// or https:// URL" in capsys.readouterr().err


CAUSED = """
groups:
  - name: g
    interval: 1m
    rules:
      - alert: Hot
        expr: gpuwatch_gpu_temperature_celsius > 85
        for: 2m
        labels: {severity: critical, cause: too-hot}
        annotations: {summary: "GPU {{ $labels.gpu }} is hot"}
"""
CONFIG = """
node_name: backtest
actions:
  slurm:
    drain_on: [too-*]
    max_drained_fraction: 0.5
    resume_after: 2m
notify:
  receivers:
    - {name: chat, type: webhook, url: "http://127.0.0.1:9/hook"}
"""


def two_nodes(selector: str, start: float, end: float) -> Fetched:
    """n1 hot in [10m, 30m), n2 in [15m, 50m); samples 7 s into each 15 s step."""
    out = []
    for node, hot in (("n1:10040", (10, 30)), ("n2:10040", (15, 50))):
        points = []
        for k in range(0, 4 * 90):
            t = T0 + 7 + 15 * k
            minute = (t - T0) / 60
            if start < t <= end:
                points.append((t, 90.0 if hot[0] <= minute < hot[1] else 60.0))
        name = ("__name__", "gpuwatch_gpu_temperature_celsius")
        out.append(((name, ("gpu", "0"), ("instance", node)), points))
    return out


def test_the_drains_the_breaker_held_and_the_pages_each_receiver_got(tmp_path: Path) -> None:
    from gpuwatch.actions.replay import Aftermath
    from gpuwatch.config import load_config

    rules, config_path = tmp_path / "rules.yaml", tmp_path / "gpuwatch.yaml"
    rules.write_text(CAUSED)
    config_path.write_text(CONFIG)
    config = load_config(config_path)
    test = Backtest(load_rule_file(str(rules)), two_nodes)
    after = Aftermath(config.actions.slurm, config.notify, test.instances)
    test.run(T0, T0 + 80 * 60, after.observe)
    after.finish(T0 + 80 * 60)
    minute = lambda t: (t - T0) / 60  # noqa: E731
    assert [(a.node, minute(a.time), a.action) for a in after.actions] == [
        ("n1:10040", 13.0, "drain"),  # hot read at 11m, firing at 13m
        # 1 of the 2 nodes out: half the partition, the breaker's limit
        ("n2:10040", 18.0, "held"),
        ("n1:10040", 33.0, "resume"),  # resolved at 31m, clear for 2 minutes
        ("n2:10040", 33.0, "drain"),
        ("n2:10040", 53.0, "resume"),
    ]
    assert after.actions[0].message == "drained: gpuwatch: too-hot GPU 0:"  # the reason Slurm gets
    assert after.actions[1].message.startswith(
        "drain held: gpuwatch has 1 of 2 nodes of partition history out already"
    )
    # A critical alert's group waits 0 s, then flushes every minute from its first page: the
    # flush due at the minute the alert resolves comes before that minute's evaluation, so
    # the resolution goes out with the next. Each node's daemon pages for itself.
    assert [(p.receiver, p.node, minute(p.time), p.alerts) for p in after.pages] == [
        ("chat", "n1:10040", 13.0, (("Hot", "firing"),)),
        ("chat", "n2:10040", 18.0, (("Hot", "firing"),)),
        ("chat", "n1:10040", 32.0, (("Hot", "resolved"),)),
        ("chat", "n2:10040", 52.0, (("Hot", "resolved"),)),
    ]


def test_a_series_that_went_away_stops_where_prometheus_saw_it_stop(tmp_path: Path) -> None:
    """Its `up` says when the target was scraped: the first scrape without the series is
    where Prometheus wrote its stale marker, not 5 minutes of lookback later."""
    target = (("instance", "n1:10040"), ("job", "gpuwatch"))

    def scraped(selector: str, start: float, end: float) -> Fetched:
        times = [T0 + 5 + 15 * k for k in range(4 * 30) if start < T0 + 5 + 15 * k <= end]
        if selector == "up":
            return [((("__name__", "up"), *target), [(t, 1.0) for t in times])]
        gone = T0 + 10 * 60  # the daemon stopped reporting the series at 10 minutes
        points = [(t, 90.0) for t in times if t < gone]
        return [((("__name__", "temp"), ("gpu", "1"), *target), points)] if points else []

    path = tmp_path / "rules.yaml"
    path.write_text(
        "groups:\n  - name: g\n    rules:\n      - alert: Hot\n        expr: temp > 85\n"
    )
    test = Backtest(load_rule_file(str(path)), scraped)
    assert spans(test.run(T0, T0 + 20 * 60)) == [("Hot", "firing", 1.0, 11.0)]
    assert test.scrapes.marked == 1


def test_a_range_over_a_series_the_files_record_does_not_depend_on_the_chunk(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "groups:\n  - name: g\n    interval: 1m\n    rules:\n"
        "      - record: r:temp\n        expr: temp\n"
        "      - alert: HotWithinHalfAnHour\n        expr: max_over_time(r:temp[30m]) > 85\n"
    )
    found = {
        chunk: spans(Backtest(load_rule_file(str(path)), History(), chunk=chunk).run(T0, T0 + 5400))
        for chunk in (3600.0, 300.0, 60.0)
    }
    assert found[3600.0] == found[300.0] == found[60.0]
    assert ("HotWithinHalfAnHour", "firing", 21.0, 70.0) in found[60.0]


def test_a_rule_that_fails_is_counted_with_its_error(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    clash = 'vector(1) * on() group_left() (temp or label_replace(temp, "c", "1", "", ""))'
    path.write_text(
        f"groups:\n  - name: g\n    rules:\n      - alert: Clash\n        expr: '{clash}'\n"
    )
    test = Backtest(load_rule_file(str(path)), History())
    test.run(T0, T0 + 600)
    (name, (count, error)) = next(iter(test.failures.items()))
    assert (name, count) == ("Clash", 10)  # every evaluation but the first, before any sample
    assert "many-to-many" in error or "duplicate series" in error
