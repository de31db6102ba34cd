"""The notifier: fed the rule engine's alerts after every evaluation, it routes and groups them
(dispatch), keeps what it must send in the outbox (db), and delivers it with one task per
receiver (sender). Alertmanager receivers get every alert as Prometheus would send them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from gpuwatch import __version__
from gpuwatch import metrics as m
from gpuwatch.clock import Clock, wait_event
from gpuwatch.model import NotifyAlert, Sample
from gpuwatch.notify import formats
from gpuwatch.notify.config import NotifyConfig
from gpuwatch.notify.db import NotifyDb
from gpuwatch.notify.dispatch import Dispatcher
from gpuwatch.notify.formats import alertmanager
from gpuwatch.notify.message import GpuIdentity
from gpuwatch.notify.sender import ReceiverSender
from gpuwatch.notify.silences import Silences
from gpuwatch.state.statedir import StateProblems

log = logging.getLogger(__name__)

USER_AGENT = f"gpuwatch/{__version__}"

OUTCOMES = ("sent", "failed", "throttled", "rejected")
STORE_RETRY_S = 5.0  # after the outbox could not commit (a full disk): try again this soon
NOTIFY_DB = "notify.db"


class Notifier:
    def __init__(
        self,
        config: NotifyConfig,
        state_dir: Path | None,
        clock: Clock,
        *,
        node: str,
        external_url: str,
        interval: float,
        problems: StateProblems | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.clock = clock
        self.node = node
        self.default_external_url = external_url  # the daemon's own, when the config has none
        self.interval = interval
        self.problems = problems if problems is not None else StateProblems(None)
        self._store_retry_at = float("-inf")  # after a failed commit: when to try again
        self.db = NotifyDb(state_dir)
        self.silences = Silences(self.db)
        self.counts: Counter[tuple[str, str]] = Counter()
        self._configure(config)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def _configure(self, config: NotifyConfig) -> None:
        """Routes, groups and one sender per receiver, over the outbox that stays."""
        self.config = config
        self.external_url = config.external_url or self.default_external_url
        grouped = [r for r in config.receivers if r.type != "alertmanager"]
        self.forwarded = [r for r in config.receivers if r.type == "alertmanager"]
        self.dispatcher = Dispatcher(
            replace(config, receivers=tuple(grouped)),
            self.db,
            self.silences,
            formats.render,
            node=self.node,
            external_url=self.external_url,
        )
        self.senders = {
            r.name: ReceiverSender(
                r,
                self.db,
                self.clock,
                self.counts,
                alertmanager.api_url(r.url.reveal())
                if r.type == "alertmanager"
                else r.url.reveal(),
            )
            for r in config.receivers
        }
        self._forwarded_state: tuple[tuple[str, str], ...] = ()
        self._forwarded_at = float("-inf")

    async def start(self) -> None:
        # Named as receivers' logs and proxies should see it, not as the HTTP library.
        headers = {"User-Agent": USER_AGENT}
        for sender in self.senders.values():
            name = f"notify-{sender.receiver.name}"
            self._tasks.append(asyncio.create_task(sender.run(headers), name=name))
        self._tasks.append(asyncio.create_task(self._flush_loop(), name="notify-groups"))
        pending = sum(self.db.pending().values())
        if pending:
            log.info("outbox: %d notifications from before the restart, sending them", pending)

    async def _halt(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    async def stop(self) -> None:
        await self._halt()
        self.db.close()

    async def apply(self, config: NotifyConfig) -> None:
        """A reload's step for notifications: the senders stopped, and new ones for `config`
        started on the same outbox, so what was queued or told survives, as across a restart
        of the daemon."""
        await self._halt()
        self._configure(config)
        await self.start()
        log.info("notifications reconfigured: %d receivers", len(config.receivers))

    def update(
        self, now: float, firing: Iterable[NotifyAlert], gpus: Mapping[str, GpuIdentity]
    ) -> None:
        """After each evaluation, with what the rules hand over: route the alerts, flush what
        is due, wake the senders."""
        alerts = [_with_running_job(a, gpus) for a in firing]
        self.dispatcher.update(now, alerts, gpus)
        self._flush(now)
        self._forward(now, alerts)
        self._wake.set()

    def _flush(self, now: float) -> None:
        if now < self._store_retry_at:
            return
        try:
            self.db.reopen_if_unlinked()
            flushed = self.dispatcher.flush_due(now)
        except (sqlite3.Error, OSError) as exc:
            # Nothing was remembered as told: the same groups are flushed again once the
            # outbox can take them.
            self._store_failed(now, exc)
            return
        self.problems.write_ok(NOTIFY_DB)
        if flushed:
            for sender in self.senders.values():
                sender.wake.set()

    def _store_failed(self, now: float, exc: Exception) -> None:
        self.problems.write_failed(NOTIFY_DB, str(exc))
        self._store_retry_at = now + STORE_RETRY_S
        self._wake.set()

    def _forward(self, now: float, alerts: list[NotifyAlert]) -> None:
        if not self.forwarded:
            return
        state = tuple(sorted((a.fingerprint, a.status) for a in alerts))
        if state == self._forwarded_state and now - self._forwarded_at < alertmanager.RESEND_S:
            return
        self._forwarded_state, self._forwarded_at = state, now
        generator = f"{self.external_url.rstrip('/')}/api/v1/alerts" if self.external_url else ""
        items = [
            alertmanager.render(r.name, alerts, now, self.interval, generator)
            for r in self.forwarded
        ]
        try:
            self.db.enqueue(now, items)
        except (sqlite3.Error, OSError) as exc:
            self._forwarded_state = ()  # not forwarded: sent again at the next evaluation
            self._store_failed(now, exc)
            return
        for r in self.forwarded:
            self.senders[r.name].wake.set()

    async def _flush_loop(self) -> None:
        """Flush groups whose group_wait or group_interval ends between evaluations."""
        while True:
            due = self.dispatcher.next_due()
            if due is not None:
                due = max(due, self._store_retry_at)
            self._wake.clear()
            now = self.clock.now()
            if due is not None and due <= now:
                self._flush(now)
                continue
            await wait_event(self.clock, self._wake, None if due is None else due - now)

    def collect(self) -> list[Sample]:
        pending = self.db.pending()
        out: list[Sample] = []
        for r in self.config.receivers:
            labels = (("receiver", r.name),)
            for outcome in OUTCOMES:
                out.append(
                    Sample(
                        m.NOTIFICATIONS,
                        (*labels, ("outcome", outcome)),
                        float(self.counts[(r.name, outcome)]),
                    )
                )
            out.append(Sample(m.OUTBOX_PENDING, labels, float(pending.get(r.name, 0))))
            held = float(self.dispatcher.job_budget.held[r.name])
            out.append(Sample(m.NOTIFICATIONS_HELD, labels, held))
            failures = float(self.dispatcher.render_failures[r.name])
            out.append(Sample(m.NOTIFICATIONS_UNRENDERED, labels, failures))
        return out


def _with_running_job(alert: NotifyAlert, gpus: Mapping[str, GpuIdentity]) -> NotifyAlert:
    """An alert about a GPU carries whose job runs there, as the annotation `running`
    (an annotation, not a label: a job starting or ending must not make it a new alert)."""
    identity = gpus.get(alert.label("gpu"))
    if identity is None or not identity.jobs or alert.annotation("running"):
        return alert
    annotations = tuple(sorted((*alert.annotations, ("running", identity.jobs))))
    return replace(alert, annotations=annotations)
