"""Every regular expression a user writes (silences, routes, inhibitions, rules) is RE2: linear
time whatever the pattern and the label, and Prometheus's syntax, not Python's."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuwatch.notify.matchers import parse_matcher
from gpuwatch.promql.parse import QueryError, parse
from gpuwatch.rules.engine import RuleEngine
from gpuwatch.store.tsdb import Store
from tests.conftest import gpuwatch

EVIL = "(a+)+b"
LABEL = "a" * 40  # Python's re needs about 2**40 steps to fail this match


def within(seconds: float, work: Callable[[], object]) -> object:
    """work() on a thread; the test fails (instead of hanging) if it takes longer."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "a regular expression backtracked"
    return out[0]


def test_a_silence_or_route_matcher_cannot_backtrack() -> None:
    matcher = parse_matcher(f'rank=~"{EVIL}"')
    assert within(10, lambda: matcher.matches({"rank": LABEL})) is False
    assert parse_matcher('rank!~"(a+)+b"').matches({"rank": LABEL}) is True


def test_matchers_have_prometheus_syntax() -> None:
    assert not parse_matcher('x=~"[[:digit:]]+"').matches({"x": "d]"})
    assert parse_matcher('x=~"[[:digit:]]+"').matches({"x": "42"})
    assert parse_matcher('x=~"foo((?i)bar)"').matches({"x": "fooBAR"})
    with pytest.raises(ValueError, match=r"bad regular expression: .*\(RE2 syntax\)"):
        parse_matcher(r'x=~"(a)\\1"')  # a backreference: Python has them, RE2 does not


def test_a_rule_with_such_a_regex_evaluates_in_linear_time(tmp_path: Path) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n"
        f"  - record: evil\n    expr: 'train_step{{rank=~\"{EVIL}\"}}'\n"
        "  - record: posix\n    expr: 'train_step{rank=~\"[[:digit:]]+\"}'\n"
    )
    store = Store(3600.0)
    store.ingest("job", 100.0, [])
    from gpuwatch.model import Sample

    store.ingest(
        "job",
        100.0,
        [
            Sample("train_step", (("rank", LABEL),), 1.0),
            Sample("train_step", (("rank", "d]"),), 2.0),
            Sample("train_step", (("rank", "7"),), 3.0),
        ],
    )
    engine = RuleEngine(store, [str(rules)], 15.0, None)
    engine.load()
    within(10, lambda: engine.evaluate(101.0, True))
    assert [r.status.health for g in engine.groups for r in g.rules] == ["ok", "ok"]
    assert engine.recorded.select("evil") == []
    assert [s.label_dict["rank"] for s in engine.recorded.select("posix")] == ["7"]


def test_a_pattern_re2_refuses_is_a_load_error_with_its_reason(tmp_path: Path) -> None:
    with pytest.raises(QueryError, match=r"regex"):
        parse(r'x{a=~"(a)\\1"}')
    rules = tmp_path / "r.yaml"
    rules.write_text("groups:\n- name: g\n  rules:\n  - record: r\n    expr: 'x{a=~\"(?<=a)b\"}'\n")
    code, out, err = gpuwatch("rules", "check", str(rules))
    assert code != 0
    assert "(?<=a)b" in out + err and "regex" in out + err
