"""`gpuwatch rules test` agrees with the real `promtool test rules`.

Every file in tests/conformance is run through both; they must agree on pass or fail and print
the same report. Files named *_fail.test.yaml are written to fail and must fail in both.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatch.rules.ruletest import run_test_files

ROOT = Path(__file__).resolve().parents[2]
CONFORMANCE = ROOT / "tests" / "conformance"
FILES = sorted(CONFORMANCE.glob("*.test.yaml"))

pytestmark = pytest.mark.skipif(
    shutil.which("promtool") is None and not os.environ.get("GPUWATCH_REQUIRE_TOOLS"),
    reason="promtool not installed (Debian package 'prometheus')",
)

_POSITION = re.compile(r"err: \d+:\d+: parse error: .*")
_PAIR = re.compile(r"\[(\{[^\]]*\}), (\{[^\]]*\})\]")


def normalize(text: str) -> str:
    """Differences that carry no meaning: parse-error wording and position (the two parsers
    word them differently), and the order promtool prints a duplicate pair in (it varies
    from run to run)."""
    text = _POSITION.sub("err: parse error", text)
    text = re.sub(r"err: parse error: .*", "err: parse error", text)
    return _PAIR.sub(lambda m: "[" + ", ".join(sorted(m.groups())) + "]", text)


def promtool(path: Path) -> tuple[int, str, str]:
    done = subprocess.run(
        ["promtool", "test", "rules", path.name],
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr


def gpuwatch(path: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    cwd = Path.cwd()
    os.chdir(path.parent)
    try:
        code = run_test_files([path.name], out, err)
    finally:
        os.chdir(cwd)
    return code, out.getvalue(), err.getvalue()


def test_the_suite_is_big_and_has_failing_files() -> None:
    assert len(FILES) >= 40
    assert sum(1 for f in FILES if f.name.endswith("_fail.test.yaml")) >= 8


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.removesuffix(".test.yaml"))
def test_gpuwatch_agrees_with_promtool(path: Path) -> None:
    p_code, p_out, p_err = promtool(path)
    g_code, g_out, g_err = gpuwatch(path)
    should_fail = path.name.endswith("_fail.test.yaml")
    assert p_code == (1 if should_fail else 0), f"promtool itself: {p_err}"
    assert g_code == p_code
    assert g_out == p_out
    assert normalize(g_err) == normalize(p_err)


def test_the_command_line_reports_like_promtool() -> None:
    files = [f.name for f in FILES[:5]] + ["wrong_value_fail.test.yaml"]
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "rules", "test", *files],
        cwd=CONFORMANCE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    reference = subprocess.run(
        ["promtool", "test", "rules", *files],
        cwd=CONFORMANCE,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == reference.returncode == 1
    assert done.stdout == reference.stdout
    assert done.stderr == reference.stderr


_TEMPLATE_ERROR = re.compile(r'annotations?[. ]"?(\w+)"?: template: (.*)')


def _template_errors(text: str) -> dict[str, str]:
    """annotation -> message; promtool words the location differently and prints in map order."""
    return dict(m.groups() for m in map(_TEMPLATE_ERROR.search, text.splitlines()) if m)


def test_templates_go_refuses_are_refused_at_load_with_go_reasons() -> None:
    rules = CONFORMANCE / "rules" / "template_parse_errors.yaml"
    reference = subprocess.run(
        ["promtool", "check", "rules", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "rules", "check", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    expected = _template_errors(reference.stdout + reference.stderr)
    assert reference.returncode == 1 and len(expected) >= 10
    assert done.returncode != 0
    assert _template_errors(done.stdout + done.stderr) == expected
