"""SIGHUP (what `systemctl reload` sends): the config and the rule files are read again and run
at once when all of them are good; a bad one changes nothing and says why in the log."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.conftest import start_daemon, stop_daemon, wait_for
from tests.fake_services import FakeService
from tests.integration.test_push import over_tcp

RULES = """\
groups:
  - name: jobs
    rules:
      - alert: JobSaysHello
        expr: train_hello > 0
        labels: {severity: critical}
        annotations: {summary: "job {{ $labels.job }} says hello"}
"""


def config(rules: Path, token: str, hook: str) -> str:
    return (
        f"rules: {{files: [{rules}]}}\n"
        f"push: {{token: {token}}}\n"
        f"notify:\n  receivers:\n    - {{name: hooks, type: webhook, url: '{hook}'}}\n"
        # At once: without a route, a job's alerts wait 30 s to be one message per job.
        "  route: {receiver: hooks, group_wait: 0s}\n"
    )


def test_sighup_applies_a_good_config_and_keeps_everything_on_a_bad_one(tmp_path: Path) -> None:
    first, second = FakeService().up(), FakeService().up()
    rules, path = tmp_path / "rules.yaml", tmp_path / "gpuwatch.yaml"
    rules.write_text(RULES)
    path.write_text(config(rules, "token-one", first.url))
    daemon = start_daemon(tmp_path / "d", "--simulate", "healthy", "-c", str(path))
    hello = b"train_hello 1\n"
    try:
        # A new token and a new receiver, both in effect after SIGHUP.
        path.write_text(config(rules, "token-two", second.url))
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: f"reloaded {path}" in daemon.log(), timeout=10)
        assert over_tcp(daemon, hello, "token-one")[0] == 401
        assert over_tcp(daemon, hello, "token-two")[0] == 200
        [message] = wait_for(second.bodies, timeout=20)
        assert message["alerts"][0]["labels"]["alertname"] == "JobSaysHello"
        assert first.bodies() == []
        # Nothing that takes a restart changed: the listener and the simulated node's paths,
        # set over the file by the command line, are not taken for changes.
        assert "takes a restart" not in daemon.log()

        # What does take a restart is named, and the rest of the file applied.
        path.write_text(config(rules, "token-two", second.url) + "sampling: {interval: 2s}\n")
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: daemon.log().count(f"reloaded {path}") == 2, timeout=10)
        assert "reload: sampling changed; that takes a restart" in daemon.log()
        assert daemon.log().count("takes a restart") == 1

        # A config with a mistake: refused with file, line and field; the old one runs on.
        path.write_text(config(rules, "token-three", second.url) + "sampling: {interval: fast}\n")
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload failed" in daemon.log(), timeout=10)
        assert f"{path}:7: sampling.interval: expected a duration" in daemon.log()
        assert over_tcp(daemon, hello, "token-two")[0] == 200
        assert over_tcp(daemon, hello, "token-three")[0] == 401

        # A broken rule file: the old rules still evaluate, and the log says why.
        path.write_text(config(rules, "token-two", second.url))
        rules.write_text(RULES.replace("train_hello > 0", "train_hello >"))
        before = daemon.json("/api/v1/rules")["data"]["groups"][0]["lastEvaluation"]
        daemon.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "rule reload failed, keeping the old rules" in daemon.log(), timeout=10)
        why = (
            f'{rules}:5:15: group \\"jobs\\" alert \\"JobSaysHello\\": expr: 1:14: parse '
            "error: unexpected end of input"
        )
        assert why in daemon.log()  # logfmt escapes the quotes
        wait_for(
            lambda: daemon.json("/api/v1/rules")["data"]["groups"][0]["lastEvaluation"] > before,
            timeout=10,
        )
        assert [a["labels"]["alertname"] for a in daemon.json("/api/v1/alerts")["data"]["alerts"]]
        assert "gpuwatch_rules_last_reload_successful 0.0" in daemon.metrics()
    finally:
        assert stop_daemon(daemon) == 0
        first.down()
        second.down()
