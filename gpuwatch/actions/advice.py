"""Telling the node's jobs to checkpoint before the node goes away or goes bad.

After each cycle the advisor looks at the verdict's causes and the hardware's firing alerts;
when one matches `actions.checkpoint.advise_on` (or `actions.slurm.drain_on`: a drain is coming) it
sets the advice that every push's answer carries (gpuwatch.client's `should_checkpoint()`
reads it), sends `actions.checkpoint.signal` to the GPUs' processes where one is set, and
journals a `checkpoint_advice` event, once, naming why. When nothing matches
any more, the advice is withdrawn and that is journaled too.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import signal
from collections.abc import Callable, Iterable

from gpuwatch.health.view import NodeView
from gpuwatch.host import procfs
from gpuwatch.model import Event
from gpuwatch.push.jobs import CheckpointAdvice, JobInputs
from gpuwatch.text.timefmt import rfc3339

log = logging.getLogger(__name__)

MAX_REASONS = 8
MAX_SIGNALLED = 64  # pids named in the event


class CheckpointAdvisor:
    """A CycleOutput."""

    def __init__(
        self,
        patterns: Iterable[str],
        jobs: JobInputs,
        firing: Callable[[], Iterable[str]],
        publish: Callable[[Event], None],
        *,
        signal: int | None = None,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.patterns = tuple(dict.fromkeys(patterns))
        self._signal = signal  # sent to the GPUs' processes as advice starts; None: not sent
        self._kill = kill
        self._jobs = jobs  # its `advice` is what each push's answer says
        self._firing = firing  # the names of the hardware's firing alerts
        self._publish = publish

    def reasons(self, view: NodeView) -> tuple[str, ...]:
        """The causes and alert names that advise a checkpoint now, in the verdict's order."""
        names: list[str] = []
        verdicts = [view.node_verdict, *view.gpu_verdicts.values()]
        for verdict in verdicts:
            if verdict is not None:
                names.extend(c.key for c in verdict.causes)
        names.extend(self._firing())
        matched = (n for n in dict.fromkeys(names) if self._matches(n))
        return tuple(matched)[:MAX_REASONS]

    def _signal_processes(self, view: NodeView) -> list[int]:
        """The signal to each job's process the driver lists on a GPU, as Slurm's `scancel
        --signal` sends it to a job's steps. A process of no job (an MPS server, whose
        clients a USR1 would kill) is left alone, as is a pid whose process is no longer the
        one listed (it ended, and the pid was taken again: its start time differs)."""
        done: list[int] = []
        gpus = view.batch.gpus if view.batch is not None else []
        for process in {p.pid: p for g in gpus for p in g.processes}.values():
            if not process.job_id or process.started is None:
                continue
            try:
                if procfs.start_time(process.pid) != process.started:
                    continue
                self._kill(process.pid, self._signal or 0)
            except OSError as exc:
                log.warning("checkpoint signal to pid %d: %s", process.pid, exc)
                continue
            done.append(process.pid)
        return sorted(done)[:MAX_SIGNALLED]

    def _matches(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def after_cycle(self, now: float, view: NodeView) -> None:
        if not self.patterns:
            return
        reasons = self.reasons(view)
        current = self._jobs.advice
        if reasons and (current is None or current.reasons != reasons):
            since = current.since if current is not None else now
            self._jobs.advice = CheckpointAdvice(since, rfc3339(since) or "", reasons)
            if current is None:
                signalled = self._signal_processes(view) if self._signal is not None else []
                message = f"jobs told to checkpoint: {', '.join(reasons)}"
                if signalled:
                    name = signal.Signals(self._signal or 0).name
                    message += f"; {name} sent to pids {', '.join(map(str, signalled))}"
                log.warning("%s", message)
                data: dict[str, int | float | str] = {"reasons": ",".join(reasons)}
                self._publish(Event(now, "checkpoint_advice", None, None, message, data))
        elif not reasons and current is not None:
            self._jobs.advice = None
            message = f"checkpoint advice withdrawn (given since {current.since_text})"
            log.info("%s", message)
            self._publish(Event(now, "checkpoint_advice_withdrawn", None, None, message, {}))
