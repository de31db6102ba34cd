"""`gpuwatch rules test`: promtool's rule unit-test files, run by gpuwatch's own engine.

The output matches `promtool test rules` line for line where the two agree on a result, so a
diff of the two outputs is the conformance check. Where the Debian promtool (2.42) differs from
Prometheus 3, gpuwatch follows Prometheus 3: range selectors are left-open, and a test group's
`interval` defaults to `evaluation_interval` (2.42 leaves it at zero).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from gpuwatch.promql.evaluator import Evaluator
from gpuwatch.promql.memory import MemoryStorage
from gpuwatch.promql.parse import QueryError, parse
from gpuwatch.promql.values import EvalError, Labels, Scalar, StringValue, VSample, format_labels
from gpuwatch.rules.alerting import AlertingRule, AlertState, RuleGroup
from gpuwatch.rules.files import expand_paths, load_rule_files
from gpuwatch.rules.notation import MISSING, expand_values, parse_metric
from gpuwatch.store.series import on_ms
from gpuwatch.text.gofmt import format_e
from gpuwatch.text.units import parse_duration
from gpuwatch.text.yamlfile import FileError

FILE_KEYS = ("rule_files", "evaluation_interval", "group_eval_order", "tests")
GROUP_KEYS = (
    "interval", "input_series", "alert_rule_test", "promql_expr_test",
    "external_labels", "external_url", "name",
)  # fmt: skip


class TestFileError(Exception):
    pass


def go_duration(seconds: float) -> str:
    """Prometheus's model.Duration.String(): 90s -> 1m30s, 86400s -> 1d."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    out = ""
    for unit, size, exact in (
        ("y", 31_536_000_000, True),
        ("w", 604_800_000, True),
        ("d", 86_400_000, False),
        ("h", 3_600_000, False),
        ("m", 60_000, False),
        ("s", 1000, False),
        ("ms", 1, False),
    ):
        if exact and ms % size:
            continue
        if ms // size > 0:
            out += f"{ms // size}{unit}"
            ms -= (ms // size) * size
    return out


def go_time_duration(seconds: float) -> str:
    """Go's time.Duration.String() for whole seconds and more: 2m0s, 1h30m0s, 0s."""
    whole = round(seconds)
    if whole == 0:
        return "0s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def _duration(raw: Any, what: str) -> float:
    try:
        return parse_duration(str(raw)) if raw is not None else 0.0
    except ValueError as exc:
        raise TestFileError(f"{what}: {exc}") from None


def _strict(data: Any, known: tuple[str, ...], what: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise TestFileError(f"{what} must be a mapping")
    for key in data:
        if key not in known:
            raise TestFileError(
                f"{what}: field {key} not found; expected one of {', '.join(known)}"
            )
    return data


def _indent(text: str, prefix: str) -> str:
    return ("\n" + prefix).join(text.split("\n"))


@dataclass(frozen=True, order=True)
class _AlertView:
    labels: Labels
    annotations: Labels

    def __str__(self) -> str:
        return f"Labels:{format_labels(self.labels)}\nAnnotations:{format_labels(self.annotations)}"


def _alerts_string(alerts: list[_AlertView]) -> str:
    if not alerts:
        return "[]"
    parts = [f"{i}:" + _indent("\n" + str(a), "  ") for i, a in enumerate(alerts)]
    return "[\n" + ",\n".join(parts) + "\n]"


def _samples_string(samples: list[tuple[Labels, float]]) -> str:
    if not samples:
        return "nil"
    return ", ".join(f"{format_labels(m)} {format_e(v)}" for m, v in samples)


def _same_samples(a: list[tuple[Labels, float]], b: list[tuple[Labels, float]]) -> bool:
    # Exact comparison, as promtool's reflect.DeepEqual (a NaN never equals a NaN there either).
    return len(a) == len(b) and all(
        x[0] == y[0] and x[1] == y[1] for x, y in zip(a, b, strict=True)
    )


@dataclass
class _TestGroup:
    data: dict[str, Any]
    eval_interval: float
    rule_files: list[str]
    group_order: dict[str, int]
    errors: list[str] = field(default_factory=list)

    def run(self) -> list[str]:
        interval = _duration(self.data.get("interval"), "interval") or self.eval_interval
        storage = MemoryStorage()
        for i, raw in enumerate(self.data.get("input_series") or []):
            item = _strict(raw, ("series", "values"), f"input_series[{i}]")
            try:
                metric = parse_metric(str(item.get("series", "")))
                values = expand_values(str(item.get("values", "")))
            except ValueError as exc:
                return [str(exc)]
            series = storage.series(metric)
            for step, value in enumerate(values):
                if value is not MISSING:
                    series.add(on_ms(step * interval), value)
        external = {str(k): str(v) for k, v in (self.data.get("external_labels") or {}).items()}
        try:
            definitions = load_rule_files(self.rule_files)
        except FileError as exc:
            return [str(exc)]
        external_url = str(self.data.get("external_url") or "")
        groups = [RuleGroup.build(d, external, "ALERTS", external_url) for d in definitions]
        groups.sort(key=lambda g: self.group_order.get(g.definition.name, 0))
        evaluator = Evaluator(storage, subquery_step=self.eval_interval)
        test_name = self.data.get("name")
        name_line = f"    name: {test_name},\n" if test_name else ""

        alert_tests: dict[float, list[dict[str, Any]]] = {}
        for i, raw in enumerate(self.data.get("alert_rule_test") or []):
            case = _strict(raw, ("eval_time", "alertname", "exp_alerts"), f"alert_rule_test[{i}]")
            when = _duration(case.get("eval_time"), "eval_time")
            if not case.get("alertname"):
                suffix = f" (in TestGroup {test_name})" if test_name else ""
                return [
                    "an item under alert_rule_test misses required attribute alertname at "
                    f"eval_time {go_duration(when)}{suffix}"
                ]
            alert_tests.setdefault(when, []).append(case)
        expr_tests = [
            _strict(c, ("expr", "eval_time", "exp_samples"), f"promql_expr_test[{i}]")
            for i, c in enumerate(self.data.get("promql_expr_test") or [])
        ]
        times = [*alert_tests, *(_duration(c.get("eval_time"), "eval_time") for c in expr_tests)]
        max_t = max(times, default=0.0)
        pending_times = sorted(alert_tests)
        steps = math.floor(max_t / self.eval_interval + 1e-9)
        for step in range(steps + 1):
            ts = step * self.eval_interval
            eval_errors = []
            for group in groups:
                group.evaluate(evaluator, ts, storage.ingest)
                for rule in group.rules:
                    if rule.status.health == "err":
                        eval_errors.append(
                            f"    rule: {rule.rule.name}, time: {go_time_duration(ts)}, "
                            f"err: {rule.status.last_error}"
                        )
            if eval_errors:
                return self.errors + eval_errors
            while pending_times and ts <= pending_times[0] < ts + self.eval_interval:
                self._check_alerts(groups, alert_tests[pending_times.pop(0)], name_line)
        for case in expr_tests:
            self._check_expr(evaluator, case)
        return self.errors

    def _check_alerts(
        self, groups: list[RuleGroup], cases: list[dict[str, Any]], name_line: str
    ) -> None:
        for case in cases:
            name = str(case["alertname"])
            got = sorted(
                _AlertView(a.labels, a.annotations)
                for g in groups
                for r in g.rules
                if isinstance(r, AlertingRule) and r.rule.name == name
                for a in r.active.values()
                if a.state == AlertState.FIRING
            )
            expected = []
            for raw in case.get("exp_alerts") or []:
                alert = _strict(raw, ("exp_labels", "exp_annotations"), "exp_alerts")
                labels = {str(k): str(v) for k, v in (alert.get("exp_labels") or {}).items()}
                labels["alertname"] = name
                annotations = {
                    str(k): str(v) for k, v in (alert.get("exp_annotations") or {}).items()
                }
                expected.append(
                    _AlertView(tuple(sorted(labels.items())), tuple(sorted(annotations.items())))
                )
            expected.sort()
            if got != expected:
                when = go_duration(_duration(case.get("eval_time"), "eval_time"))
                self.errors.append(
                    f"{name_line}    alertname: {name}, time: {when}, \n"
                    f"        exp:{_indent(_alerts_string(expected), '            ')}, \n"
                    f"        got:{_indent(_alerts_string(got), '            ')}"
                )

    def _check_expr(self, evaluator: Evaluator, case: dict[str, Any]) -> None:
        text = str(case.get("expr", ""))
        when = _duration(case.get("eval_time"), "eval_time")
        head = f"    expr: {_go_quote_expr(text)}, time: {go_duration(when)}"
        got: list[tuple[Labels, float]]
        try:
            value = evaluator.eval(parse(text), when)
            if isinstance(value, Scalar):
                got = [((), value.value)]
            elif isinstance(value, StringValue) or (value and not isinstance(value[0], VSample)):
                raise EvalError("rule result is not a vector or scalar")
            else:
                got = [(s.metric, s.value) for s in value]  # type: ignore[union-attr]
        except (QueryError, EvalError) as exc:
            self.errors.append(f"{head}, err: {exc}")
            return
        expected: list[tuple[Labels, float]] = []
        for raw in case.get("exp_samples") or []:
            sample = _strict(raw, ("labels", "value"), "exp_samples")
            try:
                labels_text = str(sample.get("labels", ""))
                metric = parse_metric(labels_text) if labels_text.strip() not in ("", "{}") else ()
            except ValueError as exc:
                self.errors.append(f"{head}, err: labels {labels_text!r}: {exc}")
                return
            expected.append((metric, float(sample.get("value", 0))))
        expected.sort(key=lambda s: s[0])
        got.sort(key=lambda s: s[0])
        if not _same_samples(expected, got):
            self.errors.append(
                f"{head},\n        exp: {_samples_string(expected)}\n"
                f"        got: {_samples_string(got)}"
            )


def _go_quote_expr(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def run_test_file(path: str) -> list[str]:
    """The failures of one test file; empty when it passes."""
    try:
        # libyaml where PyYAML has it: a test file of a thousand series parses 10x faster
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=loader)
    except OSError as exc:
        return [f"cannot read {path}: {exc.strerror}"]
    except yaml.YAMLError as exc:
        return [f"{path}: not valid YAML: {exc}"]
    try:
        data = _strict(data, FILE_KEYS, path)
        eval_interval = _duration(data.get("evaluation_interval"), "evaluation_interval") or 60.0
        order: dict[str, int] = {}
        for i, name in enumerate(data.get("group_eval_order") or []):
            if name in order:
                return [f"group name repeated in evaluation order: {name}"]
            order[name] = i
        rule_files = expand_paths([str(p) for p in data.get("rule_files") or []], Path(path).parent)
        errors: list[str] = []
        for i, raw in enumerate(data.get("tests") or []):
            group = _strict(raw, GROUP_KEYS, f"tests[{i}]")
            errors += _TestGroup(group, eval_interval, rule_files, order).run()
        return errors
    except TestFileError as exc:
        return [f"{path}: {exc}"]


def run_test_files(paths: list[str], out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Run each file as promtool does and print the same report; 0 when all pass."""
    failed = False
    for path in paths:
        print("Unit Testing: ", path, file=out)
        errors = run_test_file(path)
        if errors:
            print("  FAILED:", file=err)
            for error in errors:
                print(error, file=err)
                print(file=out)
            failed = True
        else:
            print("  SUCCESS", file=out)
        print(file=out)
    return 1 if failed else 0
