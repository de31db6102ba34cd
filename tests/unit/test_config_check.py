"""`config check` takes the steps `run` takes before it serves: what one refuses, the other
refuses with the same words, and what one accepts the other starts with."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.cli import main
from gpuwatch.clients.config_text import duration_text
from gpuwatch.text.units import parse_duration

BAD_RULE = """groups:
  - name: node
    rules:
      - alert: Broken
        expr: rate(gpuwatch_gpu_xid_errors_total[5m]
"""


def _config(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "gpuwatch.yaml"
    path.write_text(f"state_dir: {tmp_path / 'state'}\nlisten: 127.0.0.1:0\n{body}")
    return path


@pytest.mark.parametrize(
    "case",
    [
        (
            "rules: {files: [bad.yaml]}\n",
            {"bad.yaml": BAD_RULE},
            'bad.yaml:5:15: group "node" alert "Broken": expr: 1:39: parse error: unclosed left',
        ),
        ("rules: {files: [/nonexistent/gpu.yaml]}\n", {}, "/nonexistent/gpu.yaml: cannot read"),
        (
            "rules: {files: ['rules/*.yml']}\n",
            {"rules/gpu.yaml": "groups: []\n"},
            "rules/*.yml: no file matches this glob in rules.files",
        ),
        (
            "web_config: web.yaml\n",
            {"web.yaml": "tls_server_config: {cert_file: none.crt, key_file: none.key}\n"},
            "web.yaml:1: tls_server_config.cert_file",
        ),
        (
            "push: {socket: state/gpuwatch.sock}\n",
            {},
            "is the control socket: give it its own path",
        ),
    ],
    ids=["promql-error", "missing-file", "glob-matches-nothing", "tls-files-missing", "socket"],
)
def test_what_run_refuses_config_check_refuses_with_the_same_words(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, dict[str, str], str],
) -> None:
    body, files, said = case
    monkeypatch.chdir(tmp_path)  # relative paths as an operator types them
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    config = _config(tmp_path, body).name
    assert main(["config", "check", "-c", config]) == 2
    checked = capsys.readouterr()
    assert said in checked.err, checked.err
    assert f"{config}: FAILED: gpuwatch run would refuse to start with it" in checked.err
    assert "OK" not in checked.out
    assert main(["run", "-c", config, "--simulate", "healthy"]) in (1, 2)
    assert said in capsys.readouterr().err


def test_a_glob_meant_to_match_nothing_yet_is_allowed_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "rules.d").mkdir()
    config = _config(
        tmp_path,
        f"rules: {{files: ['{tmp_path}/rules.d/*.yaml'], allow_empty_globs: true}}\n",
    )
    assert main(["config", "check", "-c", str(config)]) == 0
    checked = capsys.readouterr()
    assert f"{config}: OK (0 rule files, 0 groups)" in checked.out
    assert "allow_empty_globs: true" in checked.out
    assert f"warning: rules.files ['{tmp_path}/rules.d/*.yaml'] match no file" in checked.err
    [unraised] = [line for line in checked.err.splitlines() if "raises the verdict's" in line]
    assert unraised.startswith("warning: no loaded rule raises the verdict's causes ")
    assert "gpu-unresponsive" in unraised
    assert "thermal-slowdown" in unraised


def test_the_shipped_config_passes_with_its_packs_loaded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "check"]) == 0
    checked = capsys.readouterr()
    assert checked.out.startswith("(no file: defaults): OK (5 rule files, ")
    assert not [line for line in checked.err.splitlines() if line.startswith("warning:")]


def test_slurm_actions_whose_programs_are_not_here_are_warned_about(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    config = _config(tmp_path, "actions: {slurm: {enabled: true, drain_on: ['xid-*']}}\n")
    assert main(["config", "check", "-c", str(config)]) == 0
    err = capsys.readouterr().err
    assert "warning: actions.slurm.scontrol: 'scontrol' is not found here" in err
    assert "warning: actions.slurm.sinfo: 'sinfo' is not found here" in err


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1.0, "1s"),
        (1.5, "1s500ms"),
        (0.25, "250ms"),
        (2592000.0, "30d"),
        (93784.0, "1d2h3m4s"),
        (0.0, "0s"),
    ],
)
def test_durations_print_as_written_and_read_back_exactly(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text
    assert parse_duration(text) == seconds


def test_what_is_unset_on_purpose_is_said_not_printed_as_null(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert "null" not in out and "2592000" not in out
    assert "  retention: 30d" in out and "  interval: 1s" in out
    assert "#   sampling.timeout: one sampling interval" in out
