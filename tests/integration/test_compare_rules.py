"""tools/compare_rules.py against the real promtool: it finds what one tool accepts and the
other refuses, in plain rule files and in PrometheusRule objects."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="promtool not installed (Debian package 'prometheus')",
)

GOOD = """groups:
  - name: g
    rules:
      - alert: Hot
        expr: max_over_time(gpu_temp[10m:1m]) > 85
        annotations:
          summary: "{{ with $labels.gpu }}GPU {{ . }}{{ end }} at {{ $value | humanize }}"
"""

NATIVE = """apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: x}
spec:
  groups:
    - name: h
      rules:
        - record: n
          expr: histogram_count(rate(latency[5m]))
"""

BROKEN = """groups:
  - name: b
    rules:
      - alert: Broken
        expr: rate(x[5m]
"""


def test_disagreements_are_listed_with_gpuwatchs_reasons(tmp_path: Path) -> None:
    (tmp_path / "good.yml").write_text(GOOD)
    (tmp_path / "native.yaml").write_text(NATIVE)
    (tmp_path / "broken.yml").write_text(BROKEN)
    (tmp_path / "not-rules.yml").write_text("key: value\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "compare_rules.py"), "-v", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "native.yaml: promtool accepts, gpuwatch refuses"
    assert "function histogram_count()" in lines[1]
    assert "not-rules.yml: skipped, no rule group (not YAML, empty, or other objects)" in lines
    assert lines[-1] == (
        f"{tmp_path}: 3 files, 3 rules; promtool accepts 2, gpuwatch loads 1 (1 rules); "
        "both 1; only promtool 1; only gpuwatch 0; skipped 1 holding no rule group"
    )


def test_a_second_yaml_document_in_a_rule_file_is_a_disagreement(tmp_path: Path) -> None:
    # promtool reads the first document only; gpuwatch refuses the file: an operator who
    # concatenated two rule files must hear of it
    (tmp_path / "two.yml").write_text(GOOD + "---\n" + GOOD.replace("name: g", "name: h"))
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "compare_rules.py"), str(tmp_path / "two.yml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == "two.yml: promtool accepts, gpuwatch refuses"
    assert "two.yml" in done.stdout.splitlines()[1]
    assert "/tmp/compare-rules" not in done.stdout


def test_a_path_that_does_not_exist_is_an_error() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "compare_rules.py"), "/nonexistent/rules"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "no such file or directory: /nonexistent/rules" in done.stderr
