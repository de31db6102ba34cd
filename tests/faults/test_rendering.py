"""Labels and annotations a user pushed or a rule copied from a process: one that a format
cannot take costs that one message its decorations, never the batch or another receiver."""

from __future__ import annotations

import json

from gpuwatch.model import Event, NotifyAlert, fingerprint
from gpuwatch.notify import formats
from gpuwatch.notify.config import NotifyConfig, ReceiverConfig, Route
from gpuwatch.notify.db import NotifyDb, Outgoing
from gpuwatch.notify.dispatch import Dispatcher
from gpuwatch.notify.message import Notification
from gpuwatch.notify.silences import Silences
from gpuwatch.rules.alerting import Alert, AlertState, Transition
from gpuwatch.text.secrets import Secret

T0 = 1_800_000_000.0


def alert(name: str, **labels: str) -> NotifyAlert:
    pairs = tuple(sorted({"alertname": name, "severity": "critical", **labels}.items()))
    return NotifyAlert(pairs, (("summary", f"{name}"),), T0, None, 1.0, fingerprint(pairs))


def test_every_format_renders_a_digit_that_int_refuses() -> None:
    # "²" is a digit to str.isdigit() but not to int() ("٣" is one to both): a pushed label
    # carried it into the XID lookup and every group of the batch was lost.
    bad = alert("GpuFellOffBus", gpu="٣", xid="²", uuid="GPU-1")
    for kind in formats.FORMATS:
        receiver = ReceiverConfig(
            kind,
            kind,
            Secret("http://127.0.0.1:9/x", "inline"),
            True,
            routing_key=Secret("R" * 32, "inline"),
        )
        n = Notification(kind, "g", (("alertname", "GpuFellOffBus"),), (bad,), T0, "n1")
        out = formats.render(receiver, n)
        assert out.body, kind


def test_an_alert_with_such_a_gpu_label_is_journaled() -> None:
    labels = (("alertname", "X"), ("gpu", "²"))
    a = Alert(labels, (), AlertState.FIRING, 1.0, T0)
    event = Transition("X", a, AlertState.PENDING, AlertState.FIRING, T0).as_event()
    assert isinstance(event, Event) and event.gpu is None


class Harness:
    """Two groups (by gpu) for two receivers; `poison` is a label value the render refuses,
    `plain_too` makes the plain-text second try fail as well."""

    def __init__(self, poison: str, plain_too: bool = False) -> None:
        self.poison, self.plain_too = poison, plain_too
        receivers = tuple(
            ReceiverConfig(n, "webhook", Secret("http://x", "inline"), True) for n in ("a", "b")
        )
        route = Route(receivers=("a", "b"), group_by=("gpu",), group_wait=0.0)
        self.db = NotifyDb(None)
        self.dispatcher = Dispatcher(
            NotifyConfig(receivers, route),
            self.db,
            Silences(self.db),
            self.render,
            node="n1",
            external_url="",
        )

    def render(self, receiver: ReceiverConfig, n: Notification) -> Outgoing:
        values = [v for a in n.alerts for _, v in a.labels]
        if self.poison in values or (self.plain_too and any("\\u" in v for v in values)):
            raise ValueError("cannot render")
        gpus = [a.label("gpu") for a in n.alerts]
        return Outgoing(receiver.name, n.group_key, json.dumps(gpus).encode(), {})

    def outbox(self) -> list[tuple[str, str]]:
        rows = self.db.db.execute("SELECT receiver, body FROM outbox ORDER BY id").fetchall()
        return [(r, bytes(b).decode()) for r, b in rows]


def test_a_group_that_does_not_render_goes_as_plain_text_and_the_others_go_on() -> None:
    h = Harness(poison="\u0378bad")
    alerts = [alert("GpuFellOffBus", gpu="0"), alert("GpuFellOffBus", gpu="\u0378bad")]
    h.dispatcher.update(T0, alerts, {})
    assert h.dispatcher.flush_due(T0) == 4
    assert sorted(h.outbox()) == [
        ("a", '["0"]'),
        ("a", '["\\\\u0378bad"]'),
        ("b", '["0"]'),
        ("b", '["\\\\u0378bad"]'),
    ]
    assert h.dispatcher.render_failures == {"a": 1, "b": 1}


def test_a_group_that_renders_in_no_way_is_left_out_and_tried_again() -> None:
    h = Harness(poison="\u0378bad", plain_too=True)
    alerts = [alert("GpuFellOffBus", gpu="0"), alert("GpuFellOffBus", gpu="\u0378bad")]
    h.dispatcher.update(T0, alerts, {})
    assert h.dispatcher.flush_due(T0) == 2
    assert sorted(h.outbox()) == [("a", '["0"]'), ("b", '["0"]')]
    h.plain_too = False  # whatever refused it is fixed: the next flush tells
    interval = h.dispatcher.tree.group_interval
    h.dispatcher.update(T0 + interval, alerts, {})
    assert h.dispatcher.flush_due(T0 + interval) == 2
    assert len(h.outbox()) == 4
