"""A broken expression is placed where promtool places it: `file:line:column` of the
expression in the rule file, then `line:column` inside it. promtool, on the same file, is the
oracle; the expressions are the mistakes people make (a missing bracket, an operand, a
comma, a typo'd keyword) and the shipped rules with such mistakes put in."""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuwatch.rules.files import load_rule_file
from gpuwatch.text.yamlfile import FileError

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="promtool not installed (Debian package 'prometheus')",
)

TYPED = [
    "gpuwatch_gpu_temperature_celsius > 85 and",
    "rate(foo[5m]",
    "sum by (gpu (x)",
    "foo{a=}",
    "foo +",
    "1 +* 2",
    "sum(rate(x[5m])) by",
    "foo bar",
    "rate(x[5m]))",
    'foo{a="b" c="d"}',
    "max_over_time(x[5m:1m)",
    "x offset",
    "x > bool",
    "avg_over_time(rate(x[5m])[10m:]",
    "foo)",
    "sum without gpu (x)",
    "x == == y",
    "histogram_quantile(0.9, rate(x[5m])",
    "abs(x y)",
    "rate(x)",
    "histogram_quantile(x)",
    "sum(x[5m])",
    "x[5m] + 1",
    "1 and 2",
    "sum by (a) (x) by (b)",
    "nosuchfn(x)",
    'up{job=~"("}',
    "(x > 1",
    'x{a="b"',
    "x[5m",
    "rate(x[5m])\n  > foo bar\n",
    "rate(x[5m]) >\n",
]
RULES = Path(__file__).parents[2] / "rules"


def _broken_shipped_rules(count: int) -> list[str]:
    """Shipped expressions cut short, with a character dropped or one put in."""
    exprs = [
        " ".join(str(rule["expr"]).split())
        for pack in sorted(RULES.glob("*.yaml"))
        for group in yaml.safe_load(pack.read_text())["groups"]
        for rule in group["rules"]
    ]
    pick = random.Random(2026)
    out = []
    for _ in range(count):
        expr = pick.choice(exprs)
        at = pick.randrange(1, len(expr))
        out.append(
            pick.choice(
                [
                    expr[:at],
                    expr[: at - 1] + expr[at:],
                    expr[:at] + pick.choice("()[]{},+ x") + expr[at:],
                ]
            )
        )
    return out


def _places(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """Each failing rule's place as promtool and as gpuwatch give it: `5:15 1:42`."""
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    theirs = {
        m["rule"]: f"{m['at']} {m['inner']}"
        for m in re.finditer(
            r': (?P<at>\d+:\d+): group "g", rule \d+, "(?P<rule>R\d+)": could not parse '
            r"expression: (?P<inner>\d+:\d+):",
            done.stderr,
        )
    }
    ours: dict[str, str] = {}
    try:
        load_rule_file(str(path))
    except FileError as exc:
        for problem in exc.problems:
            m = re.match(r'group "g" alert "(R\d+)": expr', problem.field)
            inner = re.match(r"(\d+:\d+): parse error", problem.message)
            if m and inner:
                ours[m[1]] = f"{problem.line}:{problem.column} {inner[1]}"
    return theirs, ours


def _file(tmp_path: Path, exprs: list[str]) -> Path:
    path = tmp_path / "broken.yaml"
    rules = [{"alert": f"R{i}", "expr": e} for i, e in enumerate(exprs)]
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}, width=10_000))
    return path


def test_typed_mistakes_are_placed_as_promtool_places_them(tmp_path: Path) -> None:
    theirs, ours = _places(_file(tmp_path, TYPED))
    assert len(theirs) == len(TYPED)  # every one is an error to promtool
    assert ours == theirs


def test_broken_shipped_rules_are_placed_as_promtool_places_nearly_all(tmp_path: Path) -> None:
    theirs, ours = _places(_file(tmp_path, _broken_shipped_rules(200)))
    both = set(theirs) & set(ours)
    assert len(both) >= 0.95 * len(theirs) > 50  # both find nearly the same errors
    same = [rule for rule in both if ours[rule] == theirs[rule]]
    print(f"{len(same)} of {len(theirs)} placed as promtool does", file=sys.stderr)
    # A few differ where Prometheus's lexer and promql-parser split tokens apart (`==`
    # inside braces) or report a deeper error first; the rest must agree.
    assert len(same) >= 0.9 * len(theirs)
