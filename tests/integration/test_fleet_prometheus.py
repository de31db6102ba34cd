"""The fleet side as an operator sets it up: the example Prometheus config passes promtool, the
recording rules run in a real Prometheus scraping two real daemons, and every query of the Grafana
dashboard runs there, using only metric names gpuwatch serves or the recording rules define."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
from pathlib import Path
from typing import Any

import promql_parser as pp
import pytest
import yaml

from tests.conftest import DaemonProcess, start_daemon, stop_daemon, wait_for
from tests.prometheus_server import launch_prometheus, needs_prometheus

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "gpuwatch.json"
RECORDING = ROOT / "rules" / "fleet" / "recording.yaml"
BOARDS = ROOT / "rules" / "fleet" / "boards.yaml"
STRAGGLERS = ROOT / "rules" / "fleet" / "stragglers.yaml"
EXAMPLE = ROOT / "docs" / "prometheus" / "prometheus.yml"


def dashboard_queries(instance: str = ".*") -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["definition"]
        .replace("label_values(", "group by (instance) (")
        .replace(", instance)", ")")
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    return [e.replace("$instance", instance).replace("$__rate_interval", "1m") for e in exprs]


def recording_rules() -> dict[str, str]:
    files = (RECORDING, BOARDS, STRAGGLERS)
    groups = [g for f in files for g in yaml.safe_load(f.read_text())["groups"]]
    return {r["record"]: r["expr"] for g in groups for r in g["rules"] if "record" in r}


def metric_names(node: Any) -> set[str]:
    """Every metric an expression selects."""
    if isinstance(node, pp.VectorSelector):
        return {node.name} if node.name else set()
    if isinstance(node, pp.MatrixSelector):
        return metric_names(node.vector_selector)
    if isinstance(node, pp.BinaryExpr):
        return metric_names(node.lhs) | metric_names(node.rhs)
    if isinstance(node, pp.Call):
        return set().union(*(metric_names(a) for a in node.args))
    if isinstance(node, pp.AggregateExpr):
        return metric_names(node.expr) | (metric_names(node.param) if node.param else set())
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return metric_names(node.expr)
    return set()


def served_names(daemon: DaemonProcess) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+) ", daemon.metrics(), re.M))


def start_node(directory: Path, name: str) -> DaemonProcess:
    """A simulated node named `name` that has had an XID, so its fault counters exist too."""
    directory.mkdir(parents=True)
    config = directory / "gpuwatch.yaml"
    config.write_text(f"node_name: {name}\n")
    process = start_daemon(directory, "--simulate", "xid", "--speed", "10", "-c", str(config))
    return process


def gpu_uuids(daemon: DaemonProcess) -> set[str]:
    return set(re.findall(r'^gpuwatch_gpu_info\{[^}]*uuid="([^"]+)"', daemon.metrics(), re.M))


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two nodes playing the same scenario, as two hosts of one fleet would."""
    base = tmp_path_factory.mktemp("fleet")
    started = [start_node(base / name, name) for name in ("gpu-node-01", "gpu-node-02")]
    try:
        for process in started:
            # The XID counted, and counted in the GPU's life record (a cycle later).
            wait_for(lambda p=process: "gpuwatch_gpu_life_faults_total{" in p.metrics(), timeout=30)
        yield started
    finally:
        assert [stop_daemon(p) for p in started] == [0, 0]


@pytest.fixture(scope="module")
def daemon(nodes: list[DaemonProcess]) -> DaemonProcess:
    return nodes[0]


def fleet_config(directory: Path, nodes: list[DaemonProcess], *recording: Path) -> Path:
    """The example config as shipped, with these nodes as its targets, absolute rule paths,
    and every interval at 1 s so that a test sees rates and recordings within seconds."""
    config = yaml.safe_load(EXAMPLE.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [
        str((EXAMPLE.parent / f).resolve()) for f in config["rule_files"] if "fleet" not in f
    ] + [str(r) for r in recording]
    [job] = config["scrape_configs"]
    job["scrape_interval"] = "1s"
    job["static_configs"] = [{"targets": [n.url.removeprefix("http://") for n in nodes]}]
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_dashboard_and_the_recording_rules_use_only_gpuwatch_metrics(daemon: Any) -> None:
    served, recorded = served_names(daemon), recording_rules()
    used = {name for e in dashboard_queries() for name in metric_names(pp.parse(e))}
    assert used, "the dashboard has no queries"
    assert used - served - set(recorded) == set()
    for record, expr in recorded.items():
        assert metric_names(pp.parse(expr)) <= served | set(recorded), record
    # What the dashboard reads directly is gpuwatch's own.
    assert all(n.startswith("gpuwatch_") for n in used - set(recorded))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_example_config_with_every_rule_file() -> None:
    result = subprocess.run(
        ["promtool", "check", "config", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fleet/recording.yaml" in result.stdout and "training.yaml" in result.stdout


@needs_prometheus
def test_a_real_prometheus_over_two_nodes_runs_every_query_and_keeps_each_node(
    nodes: list[DaemonProcess], tmp_path: Path
) -> None:
    # Two hosts' GPUs are distinct GPUs, whatever the scenario they play.
    assert gpu_uuids(nodes[0]) and not gpu_uuids(nodes[0]) & gpu_uuids(nodes[1])
    # The recording rules as shipped, evaluated every second instead of 30 for the test.
    fast = [tmp_path / "recording.yaml", tmp_path / "boards.yaml", tmp_path / "stragglers.yaml"]
    fast[0].write_text(RECORDING.read_text().replace("interval: 30s", "interval: 1s"))
    fast[1].write_text(BOARDS.read_text().replace("interval: 1m", "interval: 1s"))
    fast[2].write_text(STRAGGLERS.read_text().replace("interval: 30s", "interval: 1s"))
    prom = launch_prometheus(tmp_path, fleet_config(tmp_path, nodes, *fast))
    instances = [n.url.removeprefix("http://") for n in nodes]
    try:
        # Until every query has data: rates need two scrapes, the recording rules an evaluation.
        deadline = time.monotonic() + 60
        while True:
            try:
                empty = [
                    expr
                    for expr in dashboard_queries(instances[0])
                    if not prom.query(expr) and not re.search(r"(==|>) ?\d", expr)
                ]
                # The XID on GPU 1 pages on both nodes, each alert naming its own node.
                alerts = prom.query('ALERTS{alertstate="firing", gpu="1"}')
                if {a["metric"].get("instance") for a in alerts} != set(instances):
                    empty.append("(a firing GPU 1 alert for each node)")
                # Each node's GPU 1 has its XID in its life record, by its own serial.
                boards = prom.query("serial_instance:gpuwatch_gpu_life_faults:sum")
                if len({(b["metric"]["instance"], b["metric"]["serial"]) for b in boards}) != 2:
                    empty.append("(a board with faults on each node)")
                # Both nodes play Slurm job 81234: one job over two nodes, every GPU compared.
                ratios = prom.query("scheduler_job_id:gpuwatch_gpu_sm_clock:median_ratio")
                if len({r["metric"]["instance"] for r in ratios}) != 2:
                    empty.append("(each node's GPUs against the job's across both)")
            except urllib.error.HTTPError:
                raise  # a query Prometheus refuses
            except OSError:
                empty = ["(Prometheus is not answering yet)"]
            if not empty:
                break
            assert time.monotonic() < deadline, (empty, prom.log())
            time.sleep(0.5)
        every = prom.query("ALERTS")
        assert all(a["metric"].get("instance") in instances for a in every), every
        # No rule failed on the two nodes' series (a many-to-many match, a clash of labels).
        failing = {r["name"]: r.get("lastError") for r in prom.rules() if r["health"] == "err"}
        assert failing == {}
    finally:
        prom.stop()
