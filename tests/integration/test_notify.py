"""Alerts reach people: the daemon posting to loopback receivers that behave like each service."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpuwatch import __version__
from tests.conftest import (
    DaemonProcess,
    gpuwatch,
    parse_metrics,
    start_daemon,
    stop_daemon,
    wait_for,
)
from tests.fake_services import FakeService

V4_KEYS = {"version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
           "commonLabels", "commonAnnotations", "externalURL", "alerts"}  # fmt: skip
V4_ALERT_KEYS = {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL",
                 "fingerprint"}  # fmt: skip


def epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def services() -> Any:
    started: list[FakeService] = []

    def make(kind: str = "webhook") -> FakeService:
        service = FakeService(kind).up()
        started.append(service)
        return service

    yield make
    for service in started:
        service.down()


def outcome(daemon: DaemonProcess, receiver: str, what: str) -> float:
    for labels, value in parse_metrics(daemon.metrics()).get("gpuwatch_notifications_total", []):
        if labels == {"receiver": receiver, "outcome": what}:
            return value
    return 0.0


def test_a_gpu_falling_off_the_bus_reaches_a_webhook_within_a_second(
    tmp_path: Path, services: Any
) -> None:
    hook = services("webhook")
    dead = services("webhook")
    dead.down()  # a second receiver that is down must not hold up the first
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(  # a minimal config, with the receiver's port
        "notify:\n"
        "  receivers:\n"
        "    - name: ops\n"
        "      type: webhook\n"
        f"      url: {hook.url}\n"
        f"    - {{name: dead, type: webhook, url: '{dead.url}'}}\n"
    )
    daemon = start_daemon(tmp_path, "--simulate", "fall_off_bus", "-c", str(config))
    try:
        [payload] = wait_for(hook.bodies, timeout=30)
        assert set(payload) == V4_KEYS
        assert payload["version"] == "4" and payload["status"] == "firing"
        assert payload["receiver"] == "ops"
        [alert] = payload["alerts"]
        assert set(alert) == V4_ALERT_KEYS
        assert alert["labels"]["alertname"] == "GpuFellOffBus"
        assert alert["labels"]["gpu"] == "1" and alert["status"] == "firing"
        assert alert["endsAt"] == "0001-01-01T00:00:00Z"
        assert alert["annotations"]["action"].startswith("Drain the node")
        # Whose work the fault hit: the simulated training job, from its process on the GPU.
        assert alert["annotations"]["running"].startswith("Slurm job 81234 of ")
        assert payload["externalURL"].startswith("http://")
        events = daemon.json("/api/v1/events?kind=xid")["data"]["events"]
        [xid79] = [e for e in events if e["xid"] == 79]
        assert xid79["message"].startswith(
            "XID 79 on GPU 1: GPU has fallen off the bus, running Slurm job 81234 of "
        )
        arrived = hook.received[0].time
        assert 0 <= arrived - epoch(xid79["time"]) < 1.0
        assert hook.received[0].headers["Idempotency-Key"].startswith("ops/")
        assert hook.received[0].headers["User-Agent"] == f"gpuwatch/{__version__}"
        wait_for(lambda: outcome(daemon, "ops", "sent") == 1)
        wait_for(lambda: outcome(daemon, "dead", "failed") >= 1)
        # Why it was not delivered, in words an operator can act on, the URL's path not shown.
        port = dead.url.split(":")[2].split("/")[0]
        said = f"not delivered (cannot connect to 127.0.0.1:{port}: Connection refused)"
        wait_for(lambda: said in daemon.log())
        pending = {
            labels["receiver"]: value
            for labels, value in parse_metrics(daemon.metrics())["gpuwatch_outbox_pending"]
        }
        assert pending == {"ops": 0.0, "dead": 1.0}
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


LONG = "The link carries gradient all-reduce traffic for the job on this GPU. " * 10
BURST_RULES = f"""
groups:
  - name: burst
    rules:
      - alert: LinkBurst
        expr: gpuwatch_gpu_nvlink_link_up == 1
        labels: {{severity: warning}}
        annotations:
          summary: "NVLink {{{{ $labels.link }}}} on GPU {{{{ $labels.gpu }}}} is up"
          description: "{LONG}"
          action: "Nothing: this rule only makes a burst of 144 alerts."
"""
KINDS = ("webhook", "slack", "mattermost", "teams", "discord", "pagerduty")


def test_every_service_accepts_a_burst_of_144_alerts_cut_to_its_limits(
    tmp_path: Path, services: Any
) -> None:
    fakes = {kind: services(kind) for kind in KINDS}
    # Each service first fails the way it does: 429 with Retry-After, Discord's retry_after,
    # a 503 twice; the notification must still arrive, once.
    fakes["slack"].respond(429, {"Retry-After": "1"})
    fakes["discord"].respond(429, {"Content-Type": "application/json"}, b'{"retry_after": 0.5}')
    fakes["webhook"].respond(503)
    fakes["webhook"].respond(503)
    rules = tmp_path / "burst.yaml"
    rules.write_text(BURST_RULES)
    receivers = "".join(
        f"    - {{name: {kind}, type: {kind}, url: '{fake.url}'"
        + (", routing_key: R0UT1NGKEYSECRET" if kind == "pagerduty" else "")
        + "}\n"
        for kind, fake in fakes.items()
    )
    routes = "".join(f"      - {{receiver: {kind}, continue: true}}\n" for kind in KINDS[1:])
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(
        f"rules: {{files: [{rules}]}}\n"
        "notify:\n"
        "  receivers:\n" + receivers + "  route:\n"
        "    receiver: webhook\n"
        "    group_by: [node]\n"
        "    group_wait: 0s\n"
        "    routes:\n" + routes + "      - {receiver: webhook}\n"
    )
    daemon = start_daemon(tmp_path, "--simulate", "healthy", "-c", str(config))
    try:
        for fake in fakes.values():
            wait_for(lambda fake=fake: fake.received, timeout=30)
        time_to = {k: f.received[0].time - f.requests[0].time for k, f in fakes.items()}
        for kind, fake in fakes.items():
            assert fake.refused == [], (kind, fake.refused[0][1])
            assert len(fake.received) == 1, kind
        assert time_to["slack"] >= 1.0  # Retry-After: 1 was honoured
        assert time_to["discord"] >= 0.5
        assert len(fakes["webhook"].requests) == 3
        webhook = fakes["webhook"].received[0].json
        assert len(webhook["alerts"]) == 144 and webhook["truncatedAlerts"] == 0
        assert "and 96 more alerts" in str(fakes["slack"].received[0].json)
        assert (
            "more alerts, left out to fit Discord" in fakes["discord"].received[0].json["content"]
        )
        assert "more alerts, left out to fit 28 KB" in str(fakes["teams"].received[0].json)
        assert "[truncated]" in fakes["mattermost"].received[0].json["attachments"][0]["text"]
        page = fakes["pagerduty"].received[0].json
        assert page["event_action"] == "trigger" and page["routing_key"] == "R0UT1NGKEYSECRET"
        assert page["payload"]["summary"].startswith("[FIRING:144] LinkBurst on ")
        wait_for(lambda: outcome(daemon, "webhook", "sent") == 1)
        assert outcome(daemon, "webhook", "failed") == 2
        assert outcome(daemon, "slack", "throttled") == 1
        assert "R0UT1NGKEYSECRET" not in daemon.log()
        assert "R0UT1NGKEYSECRET" not in str(daemon.json("/api/v1/node"))
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


TWO_XIDS = """
name: two-xids
node: {gpus: 8, model: H100, workload: training, seed: 1}
faults:
  - {kind: xid, gpu: 1, at: 10s, code: 48}
  - {kind: xid, gpu: 2, at: 10s, code: 48}
"""


def _silences(state: str) -> list[str]:
    code, out, err = gpuwatch("silence", "list", "--state-dir", state)
    assert code == 0, err
    return out.splitlines()


def test_a_silence_stops_the_matching_notifications_and_nothing_else(
    tmp_path: Path, services: Any
) -> None:
    hook = services("webhook")
    scenario = tmp_path / "two-xids.yaml"
    scenario.write_text(TWO_XIDS)
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(
        f"notify:\n  receivers:\n    - {{name: ops, type: webhook, url: '{hook.url}'}}\n"
    )
    daemon = start_daemon(tmp_path, "--simulate", str(scenario), "--speed", "2", "-c", str(config))
    state = str(tmp_path / "state")
    try:
        code, out, err = gpuwatch(
            "silence",
            "add",
            'gpu="1"',
            "alertname=~GpuXid.*",
            "--duration",
            "1h",
            "--comment",
            "GPU 1 is being swapped",
            "--author",
            "alice",
            "--state-dir",
            state,
        )
        assert code == 0, err
        silence_id = out.split()[0]
        assert 'gpu="1" alertname=~"GpuXid.*"  by alice: GPU 1 is being swapped' in out

        def notified() -> set[str]:
            return {a["labels"]["gpu"] for body in hook.bodies() for a in body["alerts"]}

        assert wait_for(notified) == {"2"}
        time.sleep(2.0)  # 4 simulated seconds more: GPU 1's alert has long been firing
        assert notified() == {"2"}
        firing = daemon.json("/api/v1/alerts")["data"]["alerts"]
        assert {a["labels"]["gpu"] for a in firing} == {"1", "2"}  # silenced, not resolved
        code, out, _ = gpuwatch("silence", "list", "--state-dir", state)
        assert code == 0 and f"{silence_id}  active" in out
        code, out, err = gpuwatch("silence", "expire", silence_id, "--state-dir", state)
        assert code == 0 and "expired" in out, err
        assert wait_for(lambda: notified() == {"1", "2"})
        code, _, err = gpuwatch("silence", "expire", "no-such-id", "--state-dir", state)
        assert code == 1 and "no silence 'no-such-id'" in err
        # An id that would smuggle a second request naming another silence expires nothing.
        code, _, err = gpuwatch("silence", "add", "gpu=3", "--state-dir", state)
        other = next(line.split()[0] for line in _silences(state) if 'gpu="3"' in line)
        smuggled = f"nope HTTP/1.1\r\nHost: x\r\n\r\nDELETE /api/v1/silence/{other}"
        code, _, err = gpuwatch("silence", "expire", smuggled, "--state-dir", state)
        assert code == 1
        assert f"{other}  active" in "\n".join(_silences(state))
        code, _, err = gpuwatch("silence", "add", "gpu=", "--state-dir", state)
        assert code == 0  # an empty value is a valid matcher: gpu label absent or empty
        code, _, err = gpuwatch("silence", "add", "gpu=~(", "--state-dir", state)
        assert code == 1 and "bad regular expression" in err
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()


# 50 alerts fire and resolve while the receiver is down for 10 simulated minutes.
SPEED = 20  # 10 simulated minutes = 30 s
CODES = (13, 31, 43, 48, 62, 74, 94)
# From 100 s to 247 s: NVML tells of XIDs only once the daemon listens for them, which a busy
# machine can delay by seconds of real time (a minute or more at this speed).
OUTAGE_XIDS = [(100.0 + 3.0 * i, i % 8, CODES[i // 8]) for i in range(50)]
OUTAGE_SCENARIO = "name: outage\nnode: {gpus: 8, model: H100, workload: training, seed: 1}\n" + (
    "faults:\n"
    + "".join(f"  - {{kind: xid, gpu: {g}, at: {t:g}s, code: {c}}}\n" for t, g, c in OUTAGE_XIDS)
)
OUTAGE_RULES = """
groups:
  - name: xid-blips
    rules:
      - alert: XidSeen
        expr: |
          increase(gpuwatch_gpu_xid_errors_total[1m]) > 0
            or (gpuwatch_gpu_xid_errors_total unless gpuwatch_gpu_xid_errors_total offset 1m)
        labels: {severity: warning}
        annotations: {summary: "XID {{ $labels.xid }} on GPU {{ $labels.gpu }}"}
"""


def outage_daemon(tmp_path: Path, hook: FakeService, scenario: str) -> DaemonProcess:
    (tmp_path / "outage.yaml").write_text(OUTAGE_SCENARIO)
    (tmp_path / "blips.yaml").write_text(OUTAGE_RULES)
    config = tmp_path / "gpuwatch.yaml"
    config.write_text(
        "sampling: {interval: 5s}\n"
        f"rules: {{files: [{tmp_path / 'blips.yaml'}]}}\n"
        "notify:\n"
        f"  receivers: [{{name: ops, type: webhook, url: '{hook.url}'}}]\n"
        "  route: {receiver: ops, group_by: ['...'], group_wait: 0s, group_interval: 1s}\n"
    )
    if scenario == "outage":
        scenario = str(tmp_path / "outage.yaml")
    return start_daemon(tmp_path, "--simulate", scenario, "--speed", str(SPEED), "-c", str(config))


STATUSES = ("firing", "resolved")


def alerts(hook: FakeService) -> list[Any]:
    """The alert of each message, in the order they arrived (group_by ['...']: one each)."""
    return [alert for body in hook.bodies() for alert in body["alerts"]]


def check_every_alert_arrived_in_order(hook: FakeService) -> None:
    assert all(len(body["alerts"]) == 1 for body in hook.bodies())
    seen: dict[tuple[str, str], list[str]] = {}
    times: list[float] = []
    for alert in alerts(hook):
        key = (alert["labels"]["gpu"], alert["labels"]["xid"])
        seen.setdefault(key, []).append(alert["status"])
        times.append(epoch(alert["startsAt" if alert["status"] == "firing" else "endsAt"]))
    assert len(seen) == 50, f"{len(seen)} alerts arrived"
    assert {k for k in seen} == {(str(g), str(c)) for _, g, c in OUTAGE_XIDS}
    assert all(statuses == list(STATUSES) for statuses in seen.values()), seen
    assert times == sorted(times)  # delivered in the order they happened


def every_transition_queued(daemon: DaemonProcess) -> bool:
    """Whether all 50 alerts have fired and each firing and resolution is in the outbox.

    Queued notifications are fired + resolved and active alerts are fired - resolved, so
    the two add up to twice the alerts fired. An alert changes state before its notification
    is queued, so the sum reaches 100 only once the last one is queued too."""
    metrics = parse_metrics(daemon.metrics())
    [(_, pending)] = metrics["gpuwatch_outbox_pending"]
    firing = [
        v for labels, v in metrics.get("gpuwatch_alerts", []) if labels["alertstate"] == "firing"
    ]
    return pending + sum(firing) >= 2 * len(OUTAGE_XIDS)


@pytest.mark.parametrize("kill", [False, True], ids=["steady", "killed-midway"])
def test_a_receiver_down_for_ten_minutes_gets_every_notification_in_order(
    tmp_path: Path, services: Any, kill: bool
) -> None:
    hook = services("webhook")
    hook.down()
    started = time.monotonic()
    daemon = outage_daemon(tmp_path, hook, "outage")
    try:
        if kill:
            # Killed once every alert has fired and been queued, most resolved, some not yet:
            # at about 270 simulated seconds on a quiet machine, later on a busy one.
            try:
                wait_for(lambda: every_transition_queued(daemon), timeout=60)
            except AssertionError:
                xids = parse_metrics(daemon.metrics()).get("gpuwatch_gpu_xid_errors_total", [])
                raise AssertionError(f"{len(xids)} of 50 XIDs seen: {xids}") from None
            daemon.proc.kill()
            daemon.proc.wait(timeout=10)
            assert hook.requests == []
            daemon = outage_daemon(tmp_path, hook, "healthy")  # no new XIDs after the restart
        time.sleep(max(0.0, 30.0 - (time.monotonic() - started)))
        pending = parse_metrics(daemon.metrics())["gpuwatch_outbox_pending"]
        assert pending[0][1] >= 50  # nothing was lost or sent while it was down
        hook.up()
        try:
            wait_for(lambda: len(hook.received) >= 100, timeout=40)
        except AssertionError:
            told = {(a["labels"]["gpu"], a["labels"]["xid"], a["status"]) for a in alerts(hook)}
            missing = {(str(g), str(c), s) for _, g, c in OUTAGE_XIDS for s in STATUSES} - told
            raise AssertionError(
                f"{len(hook.received)} of 100 arrived in {len(hook.requests)} requests; "
                f"missing (gpu, xid, status): {sorted(missing)}; "
                f"daemon log:\n{daemon.log()[-4000:]}"
            ) from None
        time.sleep(1.0)  # nothing more, and no duplicates, trails in
        check_every_alert_arrived_in_order(hook)
        assert len(hook.received) == 100
    finally:
        assert stop_daemon(daemon) == 0, daemon.log()
