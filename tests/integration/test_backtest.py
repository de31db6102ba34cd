"""`gpuwatch rules backtest` against a real Prometheus holding a known history, written into
its TSDB by promtool's own block creation from OpenMetrics text. What the backtest says each
alert did must be what Prometheus's rule evaluation of the same file records in its ALERTS
series over the same history, evaluation for evaluation: the oracle is `promtool test rules`
(Prometheus's rule manager over the same samples), asked for ALERTS at every evaluation.

A Prometheus server evaluates alerting rules at the present only, and promtool's rule
backfill (`create-blocks-from rules`) skips alerting rules, so no server records ALERTS for
the past; promtool's test harness is Prometheus's own evaluation of a past it is given.

The samples lie 7 s past each 15 s step: no sample sits on a range's edge, where Prometheus
2 (the suite's) and 3 (whose left-open ranges gpuwatch follows) read differently."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from tests.prometheus_server import PrometheusServer, launch_prometheus, needs_prometheus

RULES = Path(__file__).resolve().parents[1] / "fixtures" / "backtest" / "rules.yaml"
SPAN_S = 3 * 3600
STEP_S = 15
PHASE_S = 7  # each sample's second within its step
needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool")
Series = dict[tuple[tuple[str, str], ...], dict[int, float]]  # labels -> second -> value


def history() -> tuple[Series, Series]:
    """(temperatures, XID counters), by the second since the history's start."""
    temps: Series = {}
    xids: Series = {}
    for node in ("node-a:10040", "node-b:10040"):
        for gpu in ("0", "1"):
            labels = (("gpu", gpu), ("instance", node), ("uuid", f"GPU-{node[5]}{gpu}"))
            points: dict[int, float] = {}
            for t in range(PHASE_S, SPAN_S, STEP_S):
                minute = t / 60
                value = 60.0 + (int(gpu) + t // STEP_S) % 5  # a healthy wobble
                if node == "node-a:10040" and gpu == "1":
                    if 30 <= minute < 50:
                        value = 92.0  # hot long enough to fire
                    elif 100 <= minute < 103:
                        value = 87.0  # too short for `for`: pending only
                    elif 130 <= minute < 131.5:
                        value = 88.0  # short, twice, 3 minutes apart
                    elif 134.5 <= minute < 136:
                        value = 88.0
                if node == "node-b:10040" and gpu == "0" and 70 <= minute < 80:
                    continue  # the series stops for 10 minutes
                points[t] = value
            temps[labels] = points
    counter = (("gpu", "0"), ("instance", "node-b:10040"), ("uuid", "GPU-b0"), ("xid", "79"))
    xids[counter] = {
        t: 1.0 if t < 140 * 60 else 2.0 for t in range(120 * 60 + PHASE_S, SPAN_S, STEP_S)
    }
    return temps, xids


FAMILIES = (("gpuwatch_gpu_temperature_celsius", "gauge"), ("gpuwatch_gpu_xid_errors", "counter"))


def openmetrics(origin: int) -> str:
    lines = []
    for (name, kind), series in zip(FAMILIES, history(), strict=True):
        lines.append(f"# TYPE {name} {kind}")
        sample = f"{name}_total" if kind == "counter" else name
        for labels, points in series.items():
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            lines += [f"{sample}{{{text}}} {v} {origin + t}" for t, v in points.items()]
    return "\n".join([*lines, "# EOF"]) + "\n"


def promtool_input() -> list[dict[str, str]]:
    """The same history as promtool's input series, one value a second from 0."""
    out = []
    for (name, kind), series in zip(FAMILIES, history(), strict=True):
        sample = f"{name}_total" if kind == "counter" else name
        for labels, points in series.items():
            text = ",".join(f'{k}="{v}"' for k, v in labels)
            values = " ".join(f"{points[t]:g}" if t in points else "_" for t in range(SPAN_S))
            out.append({"series": f"{sample}{{{text}}}", "values": values})
    return out


def wait_ready(prom: PrometheusServer) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, prom.log()
        time.sleep(0.2)


@needs_prometheus
@needs_promtool
def test_the_backtest_agrees_with_prometheus_evaluation_by_evaluation(tmp_path: Path) -> None:
    origin = (int(time.time()) // 3600 - 26) * 3600  # a day ago: blocks, not the head
    source = tmp_path / "history.om"
    source.write_text(openmetrics(origin))
    made = subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(tmp_path / "tsdb"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1m}\n")
    prom = launch_prometheus(tmp_path, config)
    try:
        wait_ready(prom)
        done = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "rules", "backtest", str(RULES),
             "--prometheus", prom.url, "--from", str(origin), "--to", str(origin + SPAN_S),
             "--json"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    finally:
        prom.stop()
    assert done.returncode == 0, done.stderr
    intervals = [json.loads(line) for line in done.stdout.splitlines()]
    # The history has what the rules are for: every alert pends and fires somewhere.
    seen = {(i["alertname"], i["state"]) for i in intervals}
    assert seen == {
        (alert, state)
        for alert in ("GpuHot", "GpuXid", "GpuTemperatureGone", "NodeHot")
        for state in ("pending", "firing")
    } - {("GpuXid", "pending")}  # no `for`: firing at once

    # Prometheus's own evaluation, asked for ALERTS at each evaluation of the span.
    checks = []
    for minute in range(SPAN_S // 60 + 1):
        t = origin + minute * 60
        active = [
            {**i["labels"], "alertstate": i["state"]}
            for i in intervals
            if _at(i["start"]) <= t and (i["end"] is None or t < _at(i["end"]))
        ]
        checks.append(
            {
                "expr": "ALERTS",
                "eval_time": f"{minute}m",
                "exp_samples": [
                    {
                        "labels": "ALERTS{"
                        + ",".join(f'{k}="{v}"' for k, v in sorted(a.items()))
                        + "}",
                        "value": 1,
                    }
                    for a in active
                ],
            }
        )
    oracle = tmp_path / "oracle.test.yaml"
    oracle.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(RULES)],
                "evaluation_interval": "1m",
                # The backtest runs groups due at one time in the file's order; promtool, in
                # no set order unless told (its sort of the groups is not stable).
                "group_eval_order": ["gpus", "nodes"],
                "tests": [
                    {"interval": "1s", "input_series": promtool_input(), "promql_expr_test": checks}
                ],
            },
            width=1 << 30,
        )
    )
    judged = subprocess.run(
        ["promtool", "test", "rules", str(oracle)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert judged.returncode == 0, (judged.stdout + judged.stderr)[-4000:]
    assert "SUCCESS" in judged.stdout


def _at(text: str) -> float:
    from gpuwatch.text.timefmt import parse_rfc3339

    return parse_rfc3339(text)


class _NotPrometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if "refuse" in self.server.mode:  # type: ignore[attr-defined]
            body = b'{"status":"error","errorType":"bad_data","error":"parse error: \\u001b[31m"}'
            self.send_response(400)
        else:
            body = b"<html>a login page</html>"
            self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        return None


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("refuse", "refused gpuwatch_gpu_temperature_celsius[3600000ms]: parse error: \\x1b[31m"),
        ("html", "not a Prometheus query answer: Expecting value"),
    ],
)
def test_a_server_that_is_not_prometheus_or_refuses_is_said_in_one_line(
    tmp_path: Path, mode: str, said: str
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotPrometheus)
    server.mode = mode  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpuwatch", "rules", "backtest", str(RULES), "--prometheus",
             f"http://127.0.0.1:{server.server_port}", "--from", "2h", "--to", "1h"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 2
    assert said in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "\x1b" not in done.stderr
