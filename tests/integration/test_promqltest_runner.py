"""tools/promqltest.py, the runner of Prometheus's own PromQL test files: our files in
tests/promql pass through it, and it reports a wrong expectation as a failure, native
histograms as outside the subset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tools" / "promqltest.py"


def run(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUNNER), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def test_the_projects_promql_test_files_pass() -> None:
    files = sorted((ROOT / "tests" / "promql").glob("*.test"))
    assert files
    done = run(*files)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed, 0 outside the subset" in done.stdout


WRONG = """load 1m
  up{job="a"} 1 1 1
  up{job="b"} 0 0 0

eval instant at 2m sum(up)
  {} 2

eval instant at 2m up{job="b"}
  up{job="b"} 0

eval_fail instant at 2m sum(up)

clear
load 1m
  h {{schema:0 sum:1 count:1}}

eval instant at 2m histogram_count(h)
  {} 1
"""


def test_a_wrong_expectation_fails_and_native_histograms_are_outside(tmp_path: Path) -> None:
    path = tmp_path / "wrong.test"
    path.write_text(WRONG)
    done = run(path)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == "wrong.test:5: failed: sum(up)"
    assert lines[1].strip() == "{}: expected 2.0, got 1.0"
    assert lines[2] == "wrong.test:11: failed: sum(up)"
    assert "4 cases: 1 passed, 2 failed, 1 outside the subset, 0 explained" in done.stdout


STRICT = """load 1m
  x 1 2 3

eval range from 0 to 2m step 1m x
  x 1 2 3 4

eval range from 0 to 2m step 1m x
  x 1 2 3
  y _ _ _

eval_fail instant at 1m x
"""


def test_more_points_or_series_than_came_fail(tmp_path: Path) -> None:
    path = tmp_path / "strict.test"
    path.write_text(STRICT)
    done = run(path)
    assert done.returncode == 1
    assert "expected 4 points" in done.stdout
    assert 'missing {__name__="y"}' in done.stdout
    assert "3 cases: 0 passed, 3 failed" in done.stdout


def test_a_file_it_cannot_read_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.test"
    path.write_text("load abc\n  x 1\n")
    done = run(path, tmp_path / "missing.test")
    assert done.returncode == 2
    assert "bad.test: cannot read:" in done.stderr and "Traceback" not in done.stderr
