"""Routing, grouping and deduplication as Alertmanager does them, inhibition, silences, and a
notification log that survives a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwatch.model import NotifyAlert, fingerprint
from gpuwatch.notify.config import DEFAULT_INHIBIT_RULES, NotifyConfig, ReceiverConfig, Route
from gpuwatch.notify.db import NotifyDb, Outgoing
from gpuwatch.notify.dispatch import Dispatcher
from gpuwatch.notify.matchers import parse_matcher
from gpuwatch.notify.message import Notification
from gpuwatch.notify.silences import Silences, silence_json, silence_request
from gpuwatch.text.secrets import Secret

T0 = 1_800_000_000.0


def alert(name: str, gpu: str, severity: str, *, ends: float | None = None) -> NotifyAlert:
    labels = tuple(
        sorted({"alertname": name, "gpu": gpu, "node": "n1", "severity": severity}.items())
    )
    return NotifyAlert(labels, (("summary", f"{name} {gpu}"),), T0, ends, 1.0, fingerprint(labels))


class Harness:
    def __init__(
        self, state: Path | None = None, route: Route | None = None, send_resolved: bool = True
    ) -> None:
        self.sent: list[Notification] = []
        receiver = ReceiverConfig("ops", "webhook", Secret("http://x", "inline"), send_resolved)
        self.db = NotifyDb(state)
        self.silences = Silences(self.db)
        config = NotifyConfig((receiver,), route)
        self.dispatcher = Dispatcher(
            config, self.db, self.silences, self.render, node="n1", external_url=""
        )

    def render(self, receiver: ReceiverConfig, n: Notification) -> Outgoing:
        self.sent.append(n)
        return Outgoing(
            receiver.name,
            str(len(self.sent)),
            json.dumps([a.status for a in n.alerts]).encode(),
            {},
        )

    def step(self, t: float, *alerts: NotifyAlert) -> list[list[tuple[str, str, str]]]:
        """Update and flush at T0 + t; the messages sent, as (alertname, gpu, status) lists."""
        before = len(self.sent)
        self.dispatcher.update(T0 + t, list(alerts), {})
        self.dispatcher.flush_due(T0 + t)
        return [
            [(a.label("alertname"), a.label("gpu"), a.status) for a in n.alerts]
            for n in self.sent[before:]
        ]


def test_a_critical_alert_goes_at_once_and_a_burst_of_warnings_is_one_message() -> None:
    h = Harness()
    assert h.step(0, alert("GpuFellOffBus", "1", "critical")) == [
        [("GpuFellOffBus", "1", "firing")]
    ]
    warnings = [alert("GpuThermalThrottling", g, "warning") for g in "0123"]
    assert h.step(1, alert("GpuFellOffBus", "1", "critical"), *warnings) == []  # group_wait 30 s
    assert h.step(29, alert("GpuFellOffBus", "1", "critical"), *warnings) == []
    [message] = h.step(31, alert("GpuFellOffBus", "1", "critical"), *warnings)
    assert [gpu for _, gpu, _ in message] == ["0", "2", "3"]  # GPU 1's is inhibited: it is lost
    # Nothing new: nothing sent, until the repeat interval (4 h) has passed.
    assert h.step(400, alert("GpuFellOffBus", "1", "critical"), *warnings) == []
    assert len(h.step(4 * 3600 + 100, alert("GpuFellOffBus", "1", "critical"), *warnings)) == 2


def test_a_resolved_alert_is_sent_once_and_only_to_who_heard_it_fire() -> None:
    h = Harness()
    h.step(0, alert("GpuFellOffBus", "1", "critical"))
    assert h.step(10, alert("GpuFellOffBus", "1", "critical", ends=T0 + 10)) == []  # interval 60 s
    assert h.step(61, alert("GpuFellOffBus", "1", "critical", ends=T0 + 10)) == [
        [("GpuFellOffBus", "1", "resolved")]
    ]
    assert h.step(200, alert("GpuFellOffBus", "1", "critical", ends=T0 + 10)) == []
    quiet = Harness(send_resolved=False)
    quiet.step(0, alert("GpuFellOffBus", "1", "critical"))
    assert quiet.step(61, alert("GpuFellOffBus", "1", "critical", ends=T0 + 10)) == []


def test_an_alert_whose_rule_went_away_is_resolved() -> None:
    h = Harness()
    h.step(0, alert("GpuFellOffBus", "1", "critical"))
    assert h.step(61) == [[("GpuFellOffBus", "1", "resolved")]]


def test_a_lost_gpu_inhibits_its_other_alerts_only() -> None:
    h = Harness()
    assert len(DEFAULT_INHIBIT_RULES) == 2
    sent = h.step(
        0,
        alert("GpuFellOffBus", "1", "critical"),
        alert("GpuXidCritical", "1", "critical"),
        alert("GpuXidCritical", "2", "critical"),
    )
    assert sorted(m[0][:2] for m in sent) == [("GpuFellOffBus", "1"), ("GpuXidCritical", "2")]


def test_a_silence_mutes_what_it_matches_until_it_expires() -> None:
    h = Harness()
    silence = h.silences.add((parse_matcher('gpu="2"'),), T0, T0 + 3600, "alice", "swap")
    assert h.step(
        0, alert("GpuXidCritical", "1", "critical"), alert("GpuXidCritical", "2", "critical")
    ) == [[("GpuXidCritical", "1", "firing")]]
    h.silences.expire(silence.id, T0 + 5)
    assert h.step(
        5, alert("GpuXidCritical", "1", "critical"), alert("GpuXidCritical", "2", "critical")
    ) == [[("GpuXidCritical", "2", "firing")]]


def test_a_silence_for_ever_is_refused_and_one_stored_so_still_lists(tmp_path: Path) -> None:
    """300000y overflowed the time shown for it: each listing failed, for good."""
    h = Harness(tmp_path)
    body = {"matchers": ['gpu="2"'], "duration": "300000y"}
    with pytest.raises(ValueError, match="a duration must be under 1000y"):
        h.silences.add(*silence_request(body, T0))
    with pytest.raises(ValueError, match="a silence lasts at most 366 days"):
        h.silences.add(*silence_request({**body, "duration": "999y"}, T0))
    with pytest.raises(ValueError, match="at most 366 days"):
        h.silences.add(*silence_request({**body, "endsAt": "9999-12-31T23:59:59Z"}, T0))
    year = h.silences.add(*silence_request({**body, "duration": "365d"}, T0))
    assert silence_json(year, T0)["status"] == {"state": "active"}
    # What an older release stored, read back after an upgrade:
    h.db.db.execute(
        "INSERT INTO silences VALUES (?,?,?,?,?,?)",
        ("old", json.dumps(['gpu="3"']), T0, T0 + 300000 * 365.25 * 86400, "bob", ""),
    )
    h.db.close()
    again = Harness(tmp_path)
    listed = [silence_json(s, T0) for s in again.silences.all()]
    assert {s["id"]: s["status"]["state"] for s in listed} == {year.id: "active", "old": "active"}
    assert again.step(0, alert("GpuXidCritical", "3", "critical")) == []  # still silenced


def test_the_notification_log_survives_a_restart(tmp_path: Path) -> None:
    first = Harness(tmp_path)
    first.step(0, alert("GpuFellOffBus", "1", "critical"))
    first.db.close()
    again = Harness(tmp_path)  # the daemon restarted: same alert, still firing
    assert again.step(100, alert("GpuFellOffBus", "1", "critical")) == []
    assert again.step(200, alert("GpuFellOffBus", "1", "critical", ends=T0 + 150)) == [
        [("GpuFellOffBus", "1", "resolved")]
    ]
    assert again.db.pending() == {"ops": 2}  # the outbox kept the first run's one too


def test_child_routes_match_in_order_and_continue_fans_out() -> None:
    ops = Route(
        ("ops",),
        (parse_matcher('severity="critical"'),),
        ("...",),
        0.0,
        60.0,
        3600.0,
        True,
        name="root/0",
    )
    rest = Route(("ops",), (), ("node",), 0.0, 60.0, 3600.0, name="root/1")
    h = Harness(route=Route(("ops",), routes=(ops, rest)))
    sent = h.step(
        0, alert("GpuFellOffBus", "1", "critical"), alert("GpuPowerBrake", "2", "warning")
    )
    # The critical alert matched the first child and continued into the second as well.
    assert sorted(len(m) for m in sent) == [1, 2]
