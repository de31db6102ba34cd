"""`gpuwatch rules test` against `promtool test rules` on the same unit test: 1,000 series of
an hour at 15 s, 20 rules (recording and alerting, the constructs rule packs use), evaluated
every 15 s, with alert and expression checks at the end. Prints both wall times (best of
RUNS) and checks that both tools pass the test.

Run: .venv/bin/python bench/ruletest_speed.py [RUNS]   (needs promtool on PATH)
"""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERIES = 1000
STEPS = 240  # an hour at 15 s

RULES = """groups:
  - name: bench
    interval: 15s
    rules:
      - record: job:temp:avg
        expr: avg by (node) (gpu_temp)
      - record: job:temp:max
        expr: max by (node) (gpu_temp)
      - record: node:energy:rate5m
        expr: sum by (node) (rate(gpu_energy_total[5m]))
      - record: gpu:energy:increase1h
        expr: increase(gpu_energy_total[1h])
      - record: gpu:temp:avg10m
        expr: avg_over_time(gpu_temp[10m])
      - record: gpu:temp:max10m
        expr: max_over_time(gpu_temp[10m])
      - record: gpu:temp:deriv
        expr: deriv(gpu_temp[5m])
      - record: gpu:errors:changes
        expr: changes(gpu_errors_total[15m])
      - record: node:gpus
        expr: count by (node) (gpu_temp)
      - record: gpu:temp:above_node
        expr: gpu_temp - on(node) group_left avg by (node) (gpu_temp)
      - record: gpu:temp:q90
        expr: quantile by (node) (0.9, gpu_temp)
      - record: gpu:hot
        expr: gpu_temp > bool 80
      - record: node:top3
        expr: topk by (node) (3, gpu_temp)
      - record: gpu:energy:irate
        expr: irate(gpu_energy_total[1m])
      - alert: GpuHot
        expr: gpu_temp > 87
        for: 5m
        labels: {severity: warning}
        annotations:
          summary: "GPU {{ $labels.gpu }} on {{ $labels.node }} at {{ $value | humanize }} C"
      - alert: GpuErrors
        expr: increase(gpu_errors_total[10m]) > 0
        labels: {severity: critical}
        annotations:
          summary: "{{ $labels.node }}/{{ $labels.gpu }}: {{ printf \\"%.0f\\" $value }} errors"
      - alert: NodeHot
        expr: avg by (node) (gpu_temp) > 84
        for: 2m
      - alert: GpuMissing
        expr: absent(gpu_temp{node="n0", gpu="0"})
      - alert: EnergyStalled
        expr: rate(gpu_energy_total[5m]) == 0
        for: 5m
      - alert: TempSpread
        expr: (max by (node) (gpu_temp) - min by (node) (gpu_temp)) > 30
"""


def series_lines() -> str:
    lines = []
    for i in range(SERIES // 3):
        node, gpu = f"n{i // 8}", str(i % 8)
        hot = " 86+0.01x100 91x139" if i == 5 else f" {60 + i % 20}+0x{STEPS}"
        lines.append(f'      - series: \'gpu_temp{{node="{node}", gpu="{gpu}"}}\'\n')
        lines.append(f"        values: '{hot.strip()}'\n")
        lines.append(f'      - series: \'gpu_energy_total{{node="{node}", gpu="{gpu}"}}\'\n')
        lines.append(f"        values: '0+{300 + i % 50}x{STEPS}'\n")
        errors = f"0x200 1+1x{STEPS - 201}" if i == 7 else f"0x{STEPS}"
        lines.append(f'      - series: \'gpu_errors_total{{node="{node}", gpu="{gpu}"}}\'\n')
        lines.append(f"        values: '{errors}'\n")
    return "".join(lines)


TEST = """rule_files: [rules.yaml]
evaluation_interval: 15s
tests:
  - interval: 15s
    input_series:
{series}    alert_rule_test:
      - eval_time: 60m
        alertname: GpuHot
        exp_alerts:
          - exp_labels: {{severity: warning, node: n0, gpu: "5"}}
            exp_annotations: {{summary: "GPU 5 on n0 at 91 C"}}
      - eval_time: 60m
        alertname: GpuErrors
        exp_alerts:
          - exp_labels: {{severity: critical, node: n0, gpu: "7"}}
            exp_annotations: {{summary: "n0/7: 40 errors"}}
      - eval_time: 60m
        alertname: GpuMissing
        exp_alerts: []
    promql_expr_test:
      - expr: node:gpus{{node="n0"}}
        eval_time: 59m
        exp_samples: [{{labels: 'node:gpus{{node="n0"}}', value: 8}}]
"""


def run(cmd: list[str], cwd: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    return time.perf_counter() - started, done


def main(runs: int) -> int:
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool not found (Debian package 'prometheus')")
        return 2
    version = subprocess.run(
        [promtool, "--version"], capture_output=True, text=True, check=False
    ).stdout
    print(
        f"machine: {platform.machine()}, Python {platform.python_version()}, "
        f"{version.splitlines()[0]}"
    )
    print(f"{SERIES // 3 * 3} series x {STEPS + 1} samples, 20 rules every 15 s")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "rules.yaml").write_text(RULES)
        (work / "bench.test.yaml").write_text(TEST.format(series=series_lines()))
        tools = {
            "promtool": [promtool, "test", "rules", "bench.test.yaml"],
            "gpuwatch": [sys.executable, "-m", "gpuwatch", "rules", "test", "bench.test.yaml"],
        }
        for name, cmd in tools.items():
            times = []
            for _ in range(runs):
                elapsed, done = run(cmd, work)
                if done.returncode != 0:
                    print(f"{name} failed:\n{done.stdout}{done.stderr}")
                    return 1
                times.append(elapsed)
            each = " ".join(f"{t:.2f}" for t in times)
            print(f"{name:>9}: best {min(times):6.2f} s of {runs}  ({each})")
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 3))
