"""Taking a push that arrived whole: its body parsed (pushgate.py decides when, and charges
its sender), the GPU its sender may speak for added, and its series applied to the jobs'.
A refusal is an answer, never an exception kept: its traceback's frames would hold the body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuwatch.push.http import Stamp, accepted, error_body, parser_for, refused, unstamped
from gpuwatch.push.jobs import JobInputs
from gpuwatch.push.parse import PushError
from gpuwatch.serve.pushwire import Parsed, Request, our_fault


class PushTaker:
    def __init__(
        self, jobs: JobInputs, clock_now: Callable[[], float], stamp: Stamp = unstamped
    ) -> None:
        self.jobs = jobs
        self.clock_now = clock_now  # the daemon's clock, which dates a pushed series
        self.stamp = stamp  # the GPU a sender may speak for, from its pid

    def parse(self, request: Request) -> Parsed:
        """On the loop for a usual push, on a thread for a large one."""
        try:
            limits = self.jobs.pushed.limits
            return parser_for(request.body, request.content_type, request.job(), limits)()
        except PushError as exc:
            # Without its traceback: its frames hold the body, megabytes a refusal would keep.
            return exc.with_traceback(None)
        except Exception as exc:  # our bug, not the client's: said so, and logged
            return our_fault(exc)

    def apply(
        self, request: Request, parsed: Parsed, peer: Callable[[], str], pid: int | None = None
    ) -> tuple[int, dict[str, Any]]:
        if isinstance(parsed, PushError):  # not raised here: this frame would hold it in a cycle
            return parsed.status, refused(parsed, peer(), parsed.job or request.job() or "")
        try:
            job, samples = parsed
            samples = self.stamp(samples, pid)
            count = self.jobs.pushed.apply(job, samples, self.clock_now())
        except PushError as exc:
            # The job for the log line: a JSON body's when it was read, else the URL's.
            return exc.status, refused(exc, peer(), exc.job or request.job() or "")
        except Exception as exc:
            return 500, error_body(str(our_fault(exc)))
        return 200, accepted(job, count, self.jobs.advice)
