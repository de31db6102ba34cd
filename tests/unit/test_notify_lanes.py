"""A job's pages against the hardware's: one message per job and alert, a budget per job and
hour, and a lane of their own behind the hardware's in every receiver's outbox."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gpuwatch.model import NotifyAlert, fingerprint
from gpuwatch.notify.config import NotifyConfig, ReceiverConfig
from gpuwatch.notify.db import HARDWARE_LANE, JOB_LANE, NotifyDb, Outgoing
from gpuwatch.notify.dispatch import Dispatcher
from gpuwatch.notify.message import Notification
from gpuwatch.notify.silences import Silences
from gpuwatch.text.secrets import Secret

T0 = 1_800_000_000.0
HOUR = 3600.0


def alert(value: float, **labels: str) -> NotifyAlert:
    pairs = tuple(sorted({"node": "n1", **labels}.items()))
    return NotifyAlert(pairs, (("summary", "x"),), T0, None, value, fingerprint(pairs))


def nan(job: str, rank: int) -> NotifyAlert:
    return alert(
        float("nan"),
        alertname="TrainingLossNaN",
        job=job,
        rank=str(rank),
        severity="warning",
        provenance="job",
    )


def lost(gpu: str) -> NotifyAlert:
    return alert(
        0.0, alertname="GpuFellOffBus", gpu=gpu, severity="critical", provenance="hardware"
    )


def receiver(name: str, kind: str = "webhook") -> ReceiverConfig:
    return ReceiverConfig(name, kind, Secret("http://x", "inline"), routing_key=None)


class Node:
    def __init__(self, config: NotifyConfig, state: Path | None = None) -> None:
        self.sent: list[tuple[str, Notification]] = []
        self.db = NotifyDb(state)
        self.dispatcher = Dispatcher(
            config, self.db, Silences(self.db), self.render, node="n1", external_url=""
        )

    def render(self, r: ReceiverConfig, n: Notification) -> Outgoing:
        self.sent.append((r.name, n))
        return Outgoing(r.name, str(len(self.sent)), n.group_key.encode(), {})

    def step(self, t: float, *alerts: NotifyAlert) -> None:
        self.dispatcher.update(T0 + t, list(alerts), {})
        self.dispatcher.flush_due(T0 + t)


def test_a_jobs_ranks_are_one_message_to_its_owners_and_never_to_the_pager() -> None:
    config = NotifyConfig((receiver("chat"), receiver("pager", "pagerduty")))
    node = Node(config)
    node.step(0, *(nan("llama", r) for r in range(200)))
    node.step(31, *(nan("llama", r) for r in range(200)))  # the job route waits 30 s
    [(to, message)] = node.sent
    assert to == "chat" and len(message.alerts) == 200
    assert dict(message.group_labels) == {
        "alertname": "TrainingLossNaN",
        "job": "llama",
        "node": "n1",
    }
    node.step(32, lost("1"))
    assert sorted(to for to, n in node.sent[1:]) == ["chat", "pager"]


def test_a_job_gets_a_budget_an_hour_and_the_rest_waits_without_loss() -> None:
    node = Node(NotifyConfig((receiver("chat"),), job_notifications_per_hour=2))
    t = 0.0
    for i in range(4):  # a job that flaps: fires, resolves, fires again
        node.step(t, nan("flappy", i))
        node.step(t + 31, nan("flappy", i))
        t += 600
    assert len(node.sent) == 2
    assert node.dispatcher.job_budget.held["chat"] > 0
    node.step(HOUR + 40, nan("flappy", 3))  # the hour moved on: what waited goes out
    assert len(node.sent) == 3 and "flappy" in node.sent[-1][1].group_key


def test_all_jobs_together_get_ten_budgets_of_one() -> None:
    node = Node(NotifyConfig((receiver("chat"),), job_notifications_per_hour=1))
    alerts = [nan(f"job{j}", 0) for j in range(25)]  # a user pushing under 25 names
    node.step(0, *alerts)
    node.step(31, *alerts)
    assert len(node.sent) == 10


def test_the_hardwares_messages_leave_before_the_jobs_queued_ahead_of_them(
    tmp_path: Path,
) -> None:
    node = Node(NotifyConfig((receiver("chat"),)), tmp_path)
    jobs = [nan(f"job{j}", 0) for j in range(5)]
    node.step(0, *jobs)
    node.step(31, *jobs)
    node.step(32, *jobs, lost("1"))
    order = []
    while (head := node.db.head("chat")) is not None:
        order.append(head.body.decode())
        node.db.delivered(head.id)
    assert order[0].startswith("root/critical:") and len(order) == 6
    assert all(key.startswith("root/job:") for key in order[1:])


def test_an_outbox_from_before_lanes_keeps_its_rows_in_the_hardwares_lane(
    tmp_path: Path,
) -> None:
    old = sqlite3.connect(tmp_path / "notify.db")
    old.executescript(
        "CREATE TABLE outbox (id INTEGER PRIMARY KEY, receiver TEXT NOT NULL, key TEXT NOT NULL,"
        " body BLOB NOT NULL, headers TEXT NOT NULL, created REAL NOT NULL, attempts INTEGER"
        " NOT NULL DEFAULT 0, next_attempt REAL NOT NULL, coalesce_key TEXT);"
        "INSERT INTO outbox (receiver, key, body, headers, created, next_attempt)"
        " VALUES ('chat', 'k1', x'6f6c64', '{}', 1, 1);"
    )
    old.commit()
    old.close()
    db = NotifyDb(tmp_path)
    db.enqueue(2.0, [Outgoing("chat", "k2", b"job", {}, lane=JOB_LANE)])
    db.enqueue(3.0, [Outgoing("chat", "k3", b"new", {}, lane=HARDWARE_LANE)])
    order = []
    while (head := db.head("chat")) is not None:
        order.append(head.body)
        db.delivered(head.id)
    assert order == [b"old", b"new", b"job"]
