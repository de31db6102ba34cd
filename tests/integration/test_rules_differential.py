"""`gpuwatch rules test` against `promtool test rules` on files neither has seen before:
random series and expressions from the whole subset, generated from a seed.

Every expression is written to fail (no expected samples), so both tools print what they got;
labels must match exactly and values to 1e-9 (Prometheus 2.42 sums naively, gpuwatch exactly).
Evaluation times sit half-way between samples, off every range's edge, where Prometheus 2.42
(left-closed ranges) and Prometheus 3 (left-open, which gpuwatch follows) agree.
"""

from __future__ import annotations

import io
import math
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuwatch.rules.ruletest import run_test_files

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="promtool not installed (Debian package 'prometheus')",
)

INSTANCES = ("i1", "i2", "i3", "i4")
JOBS = {"i1": "train", "i2": "train", "i3": "infer", "i4": "infer"}
STEPS = 16
EXPRESSIONS = [
    "g1", "g1 offset 2m", "rate(c1[4m])", "increase(c1[3m])", "irate(c1[5m])", "delta(g1[4m])",
    "idelta(g1[3m])", "deriv(g1[5m])", "predict_linear(g1[5m], 300)", "changes(g1[5m])",
    "resets(c1[5m])", "avg_over_time(g1[3m])", "min_over_time(g1[4m])", "max_over_time(g1[4m])",
    "sum_over_time(g1[5m])", "count_over_time(g1[5m])", "stddev_over_time(g1[5m])",
    "quantile_over_time(0.3, g1[4m])", "last_over_time(g1[2m])", "sum by (job) (g1)",
    "avg without (inst) (g1)", "max(g1)", "min by (inst) (g1)", "count(g1 > 0.5)", "stddev(g1)",
    "topk(2, g1)", "bottomk(1, g1)", "quantile(0.7, g1)", "g1 * 2 - 1", "g1 / g2",
    "g1 > bool g2", "g1 > 0.5", "g1 and g2 > 0.5", "g1 or g3", "g1 unless g2 < 0.3",
    "g1 + on(inst, job) g2", "g1 - ignoring(job) g2", "abs(g1 - 0.5)", "round(g1, 0.1)",
    "clamp(g1, 0.2, 0.8)", "clamp_min(g1, 0.4)", "clamp_max(g1, 0.4)", "ceil(g1 * 10)",
    "floor(g1 * 10)", 'absent(g1{job="nothing"})', "absent_over_time(g3[2m])",
    "present_over_time(g3[3m])", "timestamp(g1)", "time()", "vector(time())",
    "scalar(sum(g1))", 'label_replace(g1, "n", "$1", "inst", "i(.*)")',
    "sum by (job) (rate(c1[5m]))", "g1 * on(job) group_left sum by (job) (g2)",
    "-g1 ^ 2", "g1 % 0.3", "g1 != g1", "count by (job) (g1 >= bool 0.5)",
]  # fmt: skip


def series_values(rng: random.Random, kind: str) -> str:
    out: list[str] = []
    total = 0.0
    for _ in range(STEPS):
        # Counters start at 0 and have no gaps: where a window begins well before a counter's
        # first sample, Prometheus 3 clamps the extrapolation towards zero after its threshold
        # check and 2.42 before it, and the two differ by design.
        if kind != "counter" and rng.random() < 0.1:
            out.append("_")
            continue
        if kind == "counter":
            total = 0.0 if out and rng.random() < 0.05 else total + rng.randint(0, 50) * bool(out)
            out.append(str(int(total)))
        else:
            out.append(f"{rng.random():.3f}")
    if kind == "sparse":
        out[rng.randrange(4, STEPS)] = "stale"
    return " ".join(out)


def generate(seed: int, path: Path) -> None:
    rng = random.Random(seed)
    lines = ["rule_files: []", "evaluation_interval: 1m", "tests:", "  - interval: 1m",
             "    input_series:"]  # fmt: skip
    for name, kind in (("g1", "gauge"), ("g2", "gauge"), ("g3", "sparse"), ("c1", "counter")):
        for inst in INSTANCES:
            lines.append(f'      - series: \'{name}{{inst="{inst}", job="{JOBS[inst]}"}}\'')
            lines.append(f"        values: '{series_values(rng, kind)}'")
    lines.append("    promql_expr_test:")
    for expr in EXPRESSIONS:
        minute = rng.randrange(0, STEPS + 2)
        lines.append(f"      - expr: '{expr}'")
        lines.append(f"        eval_time: {minute}m30s")
    path.write_text("\n".join(lines) + "\n")


_BLOCK = re.compile(
    r'    expr: "(.*)", time: (\S+?),?(?: err: (.*))?\n(?:        exp: .*\n        got: (.*)\n)?'
)
_SAMPLE = re.compile(r"(\{[^}]*\}) ([^,\s]+)")


def results(stderr: str) -> dict[tuple[str, str], object]:
    out: dict[tuple[str, str], object] = {}
    for m in _BLOCK.finditer(stderr):
        key = (m.group(1), m.group(2))
        if m.group(3) is not None:
            out[key] = "error"
        elif m.group(4) == "nil":
            out[key] = []
        else:
            out[key] = sorted((lab, float(v)) for lab, v in _SAMPLE.findall(m.group(4) or ""))
    return out


def close(x: float, y: float) -> bool:
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return x == y or math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)


def same(a: object, b: object) -> bool:
    if not isinstance(a, list) or not isinstance(b, list):
        return a == b
    return len(a) == len(b) and all(
        x[0] == y[0] and close(x[1], y[1]) for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("seed", range(1, int(os.environ.get("GPUWATCH_DIFF_SEEDS", "8")) + 1))
def test_gpuwatch_and_promtool_agree_on_unseen_files(seed: int, tmp_path: Path) -> None:
    path = tmp_path / f"random_{seed}.test.yaml"
    generate(seed, path)
    reference = subprocess.run(
        ["promtool", "test", "rules", path.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    err = io.StringIO()
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        code = run_test_files([path.name], io.StringIO(), err)
    finally:
        os.chdir(cwd)
    ours, theirs = results(err.getvalue()), results(reference.stderr)
    assert code == reference.returncode
    assert set(ours) == set(theirs)
    differences = {k: (ours[k], theirs[k]) for k in theirs if not same(ours[k], theirs[k])}
    assert differences == {}
