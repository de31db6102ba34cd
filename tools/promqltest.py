"""Run Prometheus's own PromQL test files (promql/promqltest/testdata/*.test, the format of
Prometheus's `promqltest` package) through gpuwatch's evaluator, and report each case as
passed, failed (with what was expected and what came), or outside gpuwatch's documented
subset (with the construct named).

    python tools/promqltest.py FILE_OR_DIR... [-v] [--json]

The files are read, not shipped: fetch them from a Prometheus release (v3.0.0's are the
reference, docs/rules.md records the result). Commands understood: `load`, `clear`,
`eval[_fail|_warn|_info|_ordered] instant at T EXPR` with expected samples or a scalar after
it, and `eval[_fail|_warn|_info] range from A to B step S EXPR` (evaluated instant by instant,
as a range query is). Values are compared as promqltest compares them: relative tolerance
1e-6, NaN equal to NaN. Outside the subset: expressions gpuwatch's parser refuses as such,
native histograms (a `load` with `{{...}}` and what follows it until `clear`), and
`@ start()`/`@ end()` in a range query (a rule is an instant query, where they are its time).
Exits 1 if any case inside the subset fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import promql_parser as pp

from gpuwatch.promql.evaluator import Evaluator
from gpuwatch.promql.memory import MemoryStorage
from gpuwatch.promql.parse import QueryError, parse
from gpuwatch.promql.values import EvalError, Labels, Scalar, Value, VSample, almost_equal
from gpuwatch.promql.walk import nodes
from gpuwatch.rules.notation import MISSING, expand_values, parse_metric
from gpuwatch.store.series import on_ms
from gpuwatch.text.units import parse_duration

_LOAD = re.compile(r"^load(?:_(with_nhcb))?\s+(.+?)$")
_INSTANT = re.compile(r"^eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$")
_RANGE = re.compile(
    r"^eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)$"
)
_SERIES = re.compile(r"^(.*?\}|[^{\s]+)\s+(.*)$")
EPSILON = 1e-6


@dataclass
class Case:
    file: str
    line: int
    expr: str
    outcome: str = "passed"  # passed, failed, outside, explained, unreadable
    why: str = ""


@dataclass
class _Eval:
    expr: str
    line: int
    mod: str
    start: float
    end: float
    step: float
    scalar: float | None = None
    expected: dict[Labels, list[float | None]] = field(default_factory=dict)
    order: list[Labels] = field(default_factory=list)
    fail_message: str | None = None
    fail_regexp: str | None = None
    native: bool = False  # a native histogram among the expected samples


def _seconds(text: str) -> float:
    text = text.strip()
    return 0.0 if text in ("0", "") else parse_duration(text)


def _number(text: str) -> float | None:
    text = text.strip()
    lowered = text.lower().lstrip("+-")
    if lowered in ("inf", "nan"):
        return float(text.replace("Inf", "inf"))
    try:
        return float(int(text, 0)) if re.fullmatch(r"[-+]?0[xX][0-9a-fA-F]+", text) else float(text)
    except ValueError:
        return None


def _series_line(text: str) -> tuple[Labels, list[float | None]]:
    match = _SERIES.match(text.strip())
    if match is None:
        raise ValueError(f"not a series: {text!r}")
    head = match.group(1).strip()
    metric = () if head == "{}" else parse_metric(head)
    return metric, expand_values(match.group(2))


class Runner:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.cases: list[Case] = []
        self.storage = MemoryStorage()
        self.native = False  # a load with native histograms since the last clear
        self.nhcb: set[str] = set()  # names loaded as native histograms by load_with_nhcb
        self.unreadable = False  # a load line this runner cannot read, since the last clear

    def run(self) -> list[Case]:
        lines = [
            "" if line.strip().startswith("#") else line.strip()
            for line in self.path.read_text(encoding="utf-8").split("\n")
        ]
        i = 0
        while i < len(lines):
            line = lines[i]
            if not line:
                i += 1
            elif line == "clear":
                self.storage, self.native, self.nhcb = MemoryStorage(), False, set()
                self.unreadable = False
                i += 1
            elif line.startswith("load"):
                i = self.load(lines, i)
            elif line.startswith("eval"):
                try:
                    i, ev = self.parse_eval(lines, i)
                except ValueError as exc:  # syntax of a newer promqltest than this reads
                    self.cases.append(Case(self.path.name, i + 1, line, "unreadable", str(exc)))
                    while i < len(lines) and lines[i]:
                        i += 1
                    continue
                self.cases.append(self.evaluate(ev))
            else:  # a command of a newer promqltest
                self.cases.append(Case(self.path.name, i + 1, line, "unreadable", "unknown"))
                while i < len(lines) and lines[i]:
                    i += 1
        return self.cases

    def load(self, lines: list[str], i: int) -> int:
        match = _LOAD.match(lines[i])
        if match is None:
            raise ValueError(f"{self.path}:{i + 1}: bad load")
        gap = _seconds(match.group(2))
        i += 1
        block: dict[Labels, list[float | None]] = {}  # a series defined twice: the last wins
        while i < len(lines) and lines[i]:
            if "{{" in lines[i]:
                self.native = True
            else:
                try:
                    metric, values = _series_line(lines[i])
                except ValueError:  # the syntax of a newer promqltest (start timestamps...)
                    self.unreadable = True
                    i += 1
                    continue
                block[metric] = values
                name = dict(metric).get("__name__", "")
                if match.group(1) and name.endswith("_bucket"):
                    # load_with_nhcb also loads each classic histogram as a native one with
                    # custom buckets, under the name without _bucket
                    self.nhcb.add(name.removesuffix("_bucket"))
            i += 1
        for metric, values in block.items():
            series = self.storage.series(metric)
            for step, value in enumerate(values):
                if value is not MISSING:
                    series.add(on_ms(step * gap), value)
        return i

    def parse_eval(self, lines: list[str], i: int) -> tuple[int, _Eval]:
        head = lines[i]
        instant, ranged = _INSTANT.match(head), _RANGE.match(head)
        if instant is not None:
            mod, at, expr = instant.group(1) or "", instant.group(2) or "0", instant.group(3)
            ev = _Eval(expr, i + 1, mod, _seconds(at), _seconds(at), 0.0)
        elif ranged is not None:
            mod, expr = ranged.group(1) or "", ranged.group(5)
            start, end = _seconds(ranged.group(2)), _seconds(ranged.group(3))
            ev = _Eval(expr, i + 1, mod + ":range", start, end, _seconds(ranged.group(4)))
        else:
            raise ValueError(f"{self.path}:{i + 1}: bad eval {head!r}")
        i += 1
        while i < len(lines) and lines[i]:
            line = lines[i]
            i += 1
            if line.startswith("expected_fail_message"):
                ev.fail_message = line.removeprefix("expected_fail_message").strip()
                break
            if line.startswith("expected_fail_regexp"):
                ev.fail_regexp = line.removeprefix("expected_fail_regexp").strip()
                break
            number = _number(line)
            if number is not None:
                ev.scalar = number
                break
            if "{{" in line:
                ev.native = True
                continue
            metric, values = _series_line(line)
            ev.expected[metric] = values
            ev.order.append(metric)
        return i, ev

    def evaluate(self, ev: _Eval) -> Case:
        case = Case(str(self.path.name), ev.line, ev.expr)
        if self.unreadable:
            case.outcome, case.why = "unreadable", "a load line of a newer promqltest syntax"
            return case
        if self.native or ev.native or "{{" in ev.expr:
            case.outcome, case.why = "outside", "native histograms"
            return case
        if self.nhcb and _selects_any(ev.expr, self.nhcb):
            case.outcome, case.why = "outside", "native histograms"
            return case
        ranged = ev.mod.endswith(":range")
        mod = ev.mod.removesuffix(":range")
        if ranged and re.search(r"@\s*(start|end)\(\)", ev.expr):
            case.outcome, case.why = "outside", "@ start()/end() in a range query"
            return case
        try:
            expr = parse(ev.expr)
        except QueryError as exc:
            text = str(exc)
            if "subset" in text:
                case.outcome, case.why = "outside", text.rsplit("subset: ", maxsplit=1)[-1]
                return case
            return self._failed_or_expected(case, mod, text, ev)
        evaluator = Evaluator(self.storage, subquery_step=60.0)
        if ranged and ev.step <= 0:
            return self._failed_or_expected(
                case, mod, "zero or negative query resolution step widths are not accepted"
            )
        times = [ev.start] if not ranged else _steps(ev.start, ev.end, ev.step)
        results: list[tuple[float, Value]] = []
        try:
            for t in times:
                results.append((t, evaluator.eval(expr, t)))
        except EvalError as exc:
            return self._failed_or_expected(case, mod, str(exc), ev)
        if mod == "fail":
            case.outcome, case.why = "failed", "expected an error, got a result"
            return case
        problem = _compare(ev, results, ranged, mod == "ordered")
        if problem:
            case.outcome, case.why = "failed", problem
            self._explain(case, expr, ranged)
        return case

    def _failed_or_expected(
        self, case: Case, mod: str, error: str, ev: _Eval | None = None
    ) -> Case:
        if mod != "fail":
            case.outcome, case.why = "failed", f"error: {error}"
            self._explain(case, None, False)
        elif ev is not None and ev.fail_message is not None and error != ev.fail_message:
            case.outcome, case.why = "failed", f"error {error!r}, expected {ev.fail_message!r}"
        elif ev is not None and ev.fail_regexp is not None and not re.search(ev.fail_regexp, error):
            case.outcome, case.why = "failed", f"error {error!r} does not match {ev.fail_regexp!r}"
        return case

    def _explain(self, case: Case, expr: pp.Expr | None, ranged: bool) -> None:
        """A failure that comes from how Prometheus's test engine differs from a default
        Prometheus 3 evaluating rules (the case is then reported as explained, with why)."""
        reason = ENGINE_OPTIONS.get(self.path.name)
        if reason is None and ranged and expr is not None and _varying_parameter(expr):
            reason = (
                "v3.0.0 evaluates an aggregation's parameter once for a whole range query; "
                "an instant query (a rule) and later versions evaluate it at each step"
            )
        if reason is not None:
            case.outcome, case.why = "explained", f"{reason} ({case.why})"


# Test files whose engine is configured unlike a default Prometheus 3.
ENGINE_OPTIONS = {
    "name_label_dropping.test": "delayed __name__ removal (the experimental flag "
    "promql-delayed-name-removal, on in Prometheus's test engine, off by default)",
}


def _varying_parameter(expr: pp.Expr) -> bool:
    """An aggregation whose parameter is not a constant (`limitk(time() % 5, x)`)."""
    found: list[bool] = []

    def visit(node: pp.Expr) -> None:
        if isinstance(node, pp.AggregateExpr) and node.param is not None:
            param = node.param
            while isinstance(param, pp.ParenExpr):
                param = param.expr
            if not isinstance(param, pp.NumberLiteral | pp.StringLiteral):
                found.append(True)

    for node, _ in nodes(expr, max_depth=1_000_000):
        visit(node)
    return bool(found)


def _selects_any(text: str, names: set[str]) -> bool:
    """Whether a selector in the expression can select a series of one of these names."""
    try:
        expr = pp.parse(text)
    except ValueError:
        return False
    found: list[bool] = []

    def visit(node: pp.Expr) -> None:
        if not isinstance(node, pp.VectorSelector):
            return
        if node.name in names:
            found.append(True)
        for m in node.matchers.matchers:
            if m.name != "__name__":
                continue
            if m.op == pp.MatchOp.Equal and m.value in names:
                found.append(True)
            if m.op == pp.MatchOp.Re and any(re.fullmatch(m.value, n) for n in names):
                found.append(True)

    for node, _ in nodes(expr, max_depth=1_000_000):
        visit(node)
    return bool(found)


def _steps(start: float, end: float, step: float) -> list[float]:
    count = round((end - start) / step) + 1 if step > 0 else 1
    return [start + i * step for i in range(count) if start + i * step <= end + 1e-9]


def _samples(value: Value) -> list[VSample] | None:
    """An instant vector's samples (a scalar as one sample without labels); None otherwise."""
    if isinstance(value, Scalar):
        return [VSample((), value.value, 0.0)]
    if isinstance(value, list) and all(isinstance(s, VSample) for s in value):
        return [s for s in value if isinstance(s, VSample)]
    return None


def _compare(ev: _Eval, results: list[tuple[float, Value]], ranged: bool, ordered: bool) -> str:
    if ranged:
        return _compare_range(ev, results)
    value = results[0][1]
    if isinstance(value, Scalar):
        if ev.scalar is None:
            return f"expected a vector, got scalar {value.value}"
        if almost_equal(ev.scalar, value.value, EPSILON):
            return ""
        return f"expected {ev.scalar}, got {value.value}"
    if ev.scalar is not None:
        return f"expected scalar {ev.scalar}, got {type(value).__name__}"
    got = _samples(value)
    if got is None:
        return f"expected an instant vector, got {type(value).__name__}"
    seen: set[Labels] = set()
    for pos, s in enumerate(got):
        if s.metric not in ev.expected:
            return f"unexpected {_show(s.metric)} {s.value}"
        if ordered and ev.order.index(s.metric) != pos:
            want = ev.order.index(s.metric) + 1
            return f"{_show(s.metric)} at position {pos + 1}, expected {want}"
        expected = ev.expected[s.metric][0]
        if expected is None or not almost_equal(expected, s.value, EPSILON):
            return f"{_show(s.metric)}: expected {expected}, got {s.value}"
        seen.add(s.metric)
    missing = [m for m in ev.expected if m not in seen]
    return f"missing {_show(missing[0])}" if missing else ""


def _compare_range(ev: _Eval, results: list[tuple[float, Value]]) -> str:
    if ev.scalar is not None:
        return "scalar expectation in a range query"
    series: dict[Labels, list[float | None]] = {}
    for i, (_, value) in enumerate(results):
        samples = _samples(value)
        if samples is None:
            return "expected an instant vector at each step"
        for s in samples:
            series.setdefault(s.metric, [None] * len(results))[i] = s.value
    for metric, wanted in ev.expected.items():
        if len(wanted) > len(results):
            return (
                f"expected {len(wanted)} points for {_show(metric)}, but the query's time "
                "range cannot return this many"
            )
    for metric, values in series.items():
        expected = ev.expected.get(metric)
        if expected is None:
            return f"unexpected {_show(metric)} {values}"
        padded = expected + [None] * (len(values) - len(expected))
        for (t, _), e, g in zip(results, padded, values, strict=False):
            if (e is None) != (g is None) or (
                e is not None and g is not None and not almost_equal(e, g, EPSILON)
            ):
                return f"{_show(metric)} at {t:g}s: expected {e}, got {g}"
    missing = [m for m in ev.expected if m not in series]  # even one expected as all `_`
    return f"missing {_show(missing[0])}" if missing else ""


def _show(metric: Labels) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in metric) + "}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("-v", "--verbose", action="store_true", help="list every case")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    files: list[Path] = []
    for path in args.paths:
        files += sorted(path.glob("*.test")) if path.is_dir() else [path]
    cases: list[Case] = []
    unreadable = 0
    for path in files:
        try:
            cases += Runner(path).run()
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            unreadable += 1
    if args.json:
        json.dump([asdict(c) for c in cases], sys.stdout, indent=1)
        print()
    else:
        outside: dict[str, int] = {}
        for c in cases:
            if c.outcome in ("failed", "explained") or (args.verbose and c.outcome != "passed"):
                print(f"{c.file}:{c.line}: {c.outcome}: {c.expr}\n    {c.why}")
            if c.outcome == "outside":
                outside[c.why] = outside.get(c.why, 0) + 1
        kinds = ("passed", "failed", "outside", "explained", "unreadable")
        counts = {k: sum(c.outcome == k for c in cases) for k in kinds}
        newer = f", {counts['unreadable']} unreadable" if counts["unreadable"] else ""
        print(
            f"{len(cases)} cases: {counts['passed']} passed, {counts['failed']} failed, "
            f"{counts['outside']} outside the subset, {counts['explained']} explained" + newer
        )
        for why, n in sorted(outside.items(), key=lambda kv: -kv[1]):
            print(f"    outside: {n:4d}  {why}")
    if unreadable:
        return 2
    return 1 if any(c.outcome == "failed" for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
