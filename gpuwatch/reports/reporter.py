"""The daemon's side of job reports: the tracker fed each cycle and each event, a report
written as each job ends (and announced in the journal), and one on request."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from gpuwatch.clock import Clock
from gpuwatch.health.view import NodeView
from gpuwatch.model import Batch, Event, Sample
from gpuwatch.reports import report
from gpuwatch.reports.text import text as report_text
from gpuwatch.reports.tracker import JobRecord, JobTracker

log = logging.getLogger(__name__)


class JobReports:
    def __init__(self, state_dir: Path, clock: Clock, publish: Callable[[Event], None]) -> None:
        self.state_dir = state_dir
        self.clock = clock
        self.publish = publish
        self.tracker = JobTracker(self._ended)

    def after_cycle(self, now: float, view: NodeView) -> None:
        self.observe(now, view.batch, view.pushed)

    def observe(self, now: float, batch: Batch | None, pushed: Iterable[Sample] = ()) -> None:
        self.tracker.observe(now, batch, pushed)

    def on_event(self, event: Event) -> None:
        self.tracker.on_event(event)

    def report(self, job_id: str) -> dict[str, Any] | None:
        """The job's report now, or None when no job of that id ran here while the daemon
        watched. Not written: anyone who reaches the listener may ask; the file is written
        once, as the job ends."""
        record = self.tracker.find(job_id)
        if record is None:
            return None
        return report.build(record, self.clock.now())

    def _ended(self, record: JobRecord) -> None:
        made = report.build(record, self.clock.now())
        path = report.write(self.state_dir, made)
        summary = report_text(made)
        log.info("%s", summary.replace("\n", ";"))
        self.publish(
            Event(
                self.clock.now(),
                "job_report",
                None,
                None,
                summary.splitlines()[0],
                {"job": record.job_id, "file": str(path) if path else ""},
            )
        )
