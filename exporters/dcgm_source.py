"""The dcgm-exporter source: scrape its /metrics each cycle and hand the daemon gpuwatch's
series (gpuwatch.exporters.dcgm maps them), GPU states and XID events.

- A scrape that fails (refused, timed out, an HTTP error, not the exposition format) marks the
  backend down (`gpuwatch_up 0`) with the reason; the next good scrape brings it back.
- A GPU that dcgm-exporter stops reporting while it reports the others is lost: dcgm-exporter
  drops a GPU that falls off the bus without a word.
- XIDs: dcgm-exporter's XID field holds the code of the last XID, not a count. Each change of
  it to a non-zero code is one XID event, journaled and counted like NVML's. What this cannot
  see: the same XID twice in a row, several XIDs within one of dcgm-exporter's collection
  intervals (only the last shows), and an XID from before gpuwatch started (the first scrape
  is the baseline; it is logged, not counted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from gpuwatch.exporters.dcgm import DcgmFormatError, DcgmGpu, DcgmReading, read_dcgm

from gpuwatch import __version__
from gpuwatch import metrics as m
from gpuwatch.clock import Clock
from gpuwatch.compat import TIMEOUT_ERRORS
from gpuwatch.host.processes import with_jobs
from gpuwatch.logs import fields as log_fields
from gpuwatch.model import BackendState, Batch, Event, GpuInfo, GpuState, GpuStatus, Sample
from gpuwatch.state.inventory import Inventory, missing_samples
from gpuwatch.web.fetch import CannotConnectError, fetch
from gpuwatch.xid.known import xid_event_text

log = logging.getLogger(__name__)

MAX_BODY = 64 * 2**20  # an exporter's /metrics is tens of KiB per GPU


class DcgmSource:
    name = "dcgm"

    def __init__(
        self,
        url: str,
        clock: Clock,
        timeout: float,
        on_event: Callable[[Event], None],
        inventory: Inventory | None = None,
    ) -> None:
        self._url = url
        self._clock = clock
        self._timeout = timeout
        self._on_event = on_event
        self._inventory = inventory
        self._backend = BackendState(up=False, name="dcgm", reason="dcgm-exporter: not scraped yet")
        self._known: dict[str, GpuInfo] = {}  # every GPU seen since start, by UUID
        self._lost: set[str] = set()
        self._xids: dict[str, int] = {}  # the last XID code seen per GPU

    @property
    def backend(self) -> BackendState:
        return self._backend

    async def start(self) -> None:
        pass  # each scrape is a connection of its own

    async def stop(self) -> None:
        pass

    async def collect(self) -> Batch:
        now = self._clock.now()
        try:
            reading = read_dcgm(await self._scrape())
        except SCRAPE_FAILURES as exc:
            return self._down(now, _why(exc))
        if not reading.gpus:
            return self._down(now, "dcgm-exporter reports no GPU")
        if not self._backend.up:
            log.info("dcgm-exporter %s up: %d GPUs", self._url, len(reading.gpus))
        driver = next(iter(reading.gpus.values())).driver_version
        self._backend = BackendState(up=True, name="dcgm", driver_version=driver)
        self._check_inventory(reading)
        self._note_xids(reading.gpus)
        states = self._states(reading.gpus)
        samples = [Sample(m.UP, (), 1.0), *missing_samples(self._backend.missing), *reading.samples]
        samples += [Sample(m.GPU_UP, self._known[u].labels, 0.0) for u in sorted(self._lost)]
        samples += [
            Sample(m.GPU_LOST, g.info.labels, float(g.status == GpuStatus.LOST)) for g in states
        ]
        return Batch(self.name, self._clock.now(), samples, self._backend, states)

    async def _scrape(self) -> str:
        headers = {"Accept": "text/plain", "User-Agent": f"gpuwatch/{__version__}"}
        answer = await fetch(
            "GET", self._url, headers=headers, timeout=self._timeout, lane="sources"
        )
        if answer.status != 200:
            raise _HttpError(f"HTTP {answer.status} {answer.reason}".strip())
        if len(answer.body) > MAX_BODY:
            raise _HttpError(f"the answer is larger than {MAX_BODY // 2**20} MiB")
        return answer.body.decode("utf-8", errors="replace")

    def _down(self, now: float, reason: str) -> Batch:
        reason = f"dcgm-exporter {self._url}: {reason}"
        if reason != self._backend.reason:
            log.error("GPU backend down: %s", reason)
        self._backend = BackendState(up=False, name="dcgm", reason=reason)
        return Batch(self.name, now, [Sample(m.UP, (), 0.0)], self._backend, [])

    def _check_inventory(self, reading: DcgmReading) -> None:
        if self._inventory is None:
            return
        missing = self._inventory.update([g.info for g in reading.gpus.values()])
        self._backend = replace(self._backend, missing=missing)

    def _states(self, gpus: dict[str, DcgmGpu]) -> list[GpuState]:
        """Every GPU seen since start: those in this scrape OK, the others lost."""
        now = self._clock.now()
        for uuid, gpu in gpus.items():
            self._known[uuid] = gpu.info
            if uuid in self._lost:
                self._lost.discard(uuid)
                message = f"GPU {gpu.info.index} reported by dcgm-exporter again"
                log.info(message, extra=log_fields(gpu=gpu.info.index, uuid=uuid))
                self._on_event(Event(now, "gpu_recovered", gpu.info.index, uuid, message))
        for uuid, info in self._known.items():
            if uuid not in gpus and uuid not in self._lost:
                self._lost.add(uuid)
                message = (
                    f"GPU {info.index} lost: dcgm-exporter no longer reports it "
                    "(fallen off the bus?)"
                )
                log.error(message, extra=log_fields(gpu=info.index, uuid=uuid))
                self._on_event(Event(now, "gpu_lost", info.index, uuid, message))
        states = [GpuState(g.info, GpuStatus.OK, "", g.processes) for g in gpus.values()]
        states += [
            GpuState(self._known[u], GpuStatus.LOST, "dcgm-exporter no longer reports it")
            for u in sorted(self._lost)
        ]
        return sorted(states, key=lambda s: s.info.index)

    def _note_xids(self, gpus: dict[str, DcgmGpu]) -> None:
        now = self._clock.now()
        for uuid, gpu in gpus.items():
            code = gpu.xid
            if code is None:
                continue
            before = self._xids.get(uuid)
            self._xids[uuid] = code
            index = gpu.info.index
            if before is None:
                if code:
                    log.info(
                        "GPU %d: dcgm-exporter shows XID %d from before gpuwatch started; "
                        "not counted",
                        index,
                        code,
                        extra=log_fields(gpu=index, uuid=uuid, xid=code),
                    )
                continue
            if code and code != before:
                message, data = with_jobs(*xid_event_text(code, index), gpu.processes)
                log.warning(
                    "%s (from dcgm-exporter)",
                    message,
                    extra=log_fields(gpu=index, uuid=uuid, xid=code),
                )
                self._on_event(Event(now, "xid", index, uuid, message, data))


class _HttpError(Exception):
    pass


# ValueError: an answer that is not HTTP, or over plainhttp's limit.
SCRAPE_FAILURES = (TimeoutError, OSError, ValueError, DcgmFormatError, _HttpError)


def _why(exc: BaseException) -> str:
    if isinstance(exc, TIMEOUT_ERRORS):
        return "no answer in time"
    if isinstance(exc, CannotConnectError):
        return f"cannot connect ({exc.why})"
    if isinstance(exc, DcgmFormatError):
        return f"not Prometheus text format: {exc}"
    return str(exc) or type(exc).__name__
