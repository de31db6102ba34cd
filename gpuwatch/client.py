"""Report training progress to the gpuwatch daemon on this node. Standard library only.

    from gpuwatch.client import JobReporter

    reporter = JobReporter(job="llama", rank=0)
    for step, batch in enumerate(loader):
        loss = train_step(batch)
        reporter.report(step=step, loss=loss.item(), tokens_per_second=tps)

While the daemon advises the job to checkpoint (the node is going away or going bad),
`should_checkpoint()` is True, read from the last push's answer at no cost; an
`on_checkpoint_advice` callback hears it start, on the reporter's thread.

`report()` only stores the newest values and returns (microseconds); a background thread
sends them to the daemon about once a second: to its push socket, which every local user may
write to, or with `url=` (or $GPUWATCH_URL) and `token=` (or $GPUWATCH_PUSH_TOKEN) over TCP
with the daemon's push token. When the daemon is away, or slow, or refuses a value, the
training loop never notices: nothing raises, nothing blocks, and the next report tries again;
the first failure of a run of them is logged (a warning on the `gpuwatch.client` logger) and
each is counted in `failed`. Each keyword becomes a metric `train_<name>` with labels `job`
and `rank`: `step=` is `train_step`, `loss=` is `train_loss` (NaN and Inf are sent as they
are).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import re
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path

__all__ = ["JobReporter", "UnixHTTPConnection"]

log = logging.getLogger(__name__)

# The push socket (any user) before the control socket (root and the daemon's group), under
# systemd and then in the default state directory.
SOCKET_CANDIDATES = (
    "/run/gpuwatch/push.sock",
    "/run/gpuwatch/gpuwatch.sock",
    "/var/lib/gpuwatch/push.sock",
    "/var/lib/gpuwatch/gpuwatch.sock",
)
SEND_EVERY_S = 1.0
TIMEOUT_S = 2.0
# The daemon refuses a whole push over one bad name, so a bad name is dropped here, once, before
# it can stop every later report of the job. (This module imports nothing of gpuwatch's: it is
# copied into training images on its own.)
METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
MAX_LABEL_VALUE = 1024  # the daemon's limit
MAX_REFUSED = 100
LABEL_NAME = re.compile(r"(?!__)[a-zA-Z_][a-zA-Z0-9_]*")  # __ names are Prometheus's own


def _default_socket() -> str:
    """$GPUWATCH_SOCKET, else the systemd unit's socket, else the default state dir's."""
    explicit = os.environ.get("GPUWATCH_SOCKET")
    if explicit:
        return explicit
    for candidate in SOCKET_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return SOCKET_CANDIDATES[0]


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (the daemon's control socket)."""

    def __init__(self, path: str, timeout: float = TIMEOUT_S) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _json_value(value: float) -> float | str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return value


class JobReporter:
    def __init__(
        self,
        job: str,
        rank: int | str = 0,
        *,
        socket_path: str | None = None,
        url: str | None = None,
        token: str | None = None,
        ca_file: str | None = None,
        labels: dict[str, str] | None = None,
        interval: float = SEND_EVERY_S,
        on_checkpoint_advice: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.job = job
        self._refused: set[str] = set()  # names dropped, each logged once
        self.labels = {
            name: str(value)
            for name, value in (labels or {}).items()
            if self._usable(name, LABEL_NAME, "label")
            and name not in ("job", "rank")
            and self._short(name, str(value))
        }
        self.labels["rank"] = str(rank)
        self.url = url or (None if socket_path else os.environ.get("GPUWATCH_URL")) or None
        self.token = token or os.environ.get("GPUWATCH_PUSH_TOKEN", "")
        self.ca_file = ca_file or os.environ.get("GPUWATCH_CA_FILE") or None
        self.socket_path = socket_path or _default_socket()
        self.interval = interval
        self._failing = False  # in a run of failed sends: logged once, at its start
        self.sent = 0  # pushes the daemon accepted
        self.failed = 0  # pushes that did not get through (daemon away, refused)
        self.ooms = 0  # CUDA out-of-memory errors counted by out_of_memory()
        self.checkpoints = 0  # checkpoints counted by checkpointed()
        # What the daemon's last answer said: why to checkpoint now (empty: no need).
        self._advice: list[str] = []
        self._on_advice = on_checkpoint_advice
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        # Sends started and finished, so flush() waits for one that began after it was called.
        self._sends = threading.Condition()
        self._started = self._finished = 0
        self._last_ok = False
        # One connection kept from send to send (the sending thread's own): a new one each
        # second per rank cost the daemon more than the push itself.
        self._conn: http.client.HTTPConnection | None = None
        self._thread = threading.Thread(target=self._run, name="gpuwatch-reporter", daemon=True)
        self._thread.start()

    def report(self, **values: float) -> None:
        """Record the newest values; they go out with the next send. Never raises."""
        try:
            update = {f"train_{k}": float(v) for k, v in values.items()}
        except (TypeError, ValueError, OverflowError):
            return  # a value that is not a number is dropped, not raised into the loop
        if not all(METRIC_NAME.fullmatch(name) for name in update):
            update = {k: v for k, v in update.items() if self._usable(k, METRIC_NAME, "metric")}
        with self._lock:
            self._latest.update(update)

    def out_of_memory(self) -> None:
        """Count one CUDA out-of-memory error the training loop caught (and survived, say by
        skipping the batch): sent as `train_oom_total`, which the shipped training pack's
        TrainingOutOfMemory alert reads. Never raises.

            except torch.cuda.OutOfMemoryError:
                reporter.out_of_memory()
        """
        with self._lock:
            self.ooms += 1
            self._latest["train_oom_total"] = float(self.ooms)

    def should_checkpoint(self) -> bool:
        """True while the daemon advises this job to checkpoint: the node is going away (a
        cloud's notice) or going bad (an early warning, a drain coming). Reads what the last
        push's answer said: no I/O, cheap enough for every step."""
        return bool(self._advice)

    @property
    def checkpoint_reasons(self) -> list[str]:
        """Why the daemon advises it (cause keys and alert names), empty when it does not."""
        return list(self._advice)

    def checkpointed(self) -> None:
        """Count a checkpoint the job has written: sent as `train_checkpoints_total`, so the
        job's report and its owner can see it answered the advice. Never raises."""
        with self._lock:
            self.checkpoints += 1
            self._latest["train_checkpoints_total"] = float(self.checkpoints)

    def flush(self, timeout: float = TIMEOUT_S) -> bool:
        """Send now and wait for it (at the end of training, say). True when it got through."""
        with self._sends:
            target = self._started + 1
            self._wake.set()
            done = self._sends.wait_for(lambda: self._finished >= target, timeout)
            return done and self._last_ok

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(TIMEOUT_S * 2)

    def _usable(self, name: str, pattern: re.Pattern[str], what: str) -> bool:
        if pattern.fullmatch(name):
            return True
        self._refuse(name, f"{what} name {name!r} is not a valid Prometheus name")
        return False

    def _short(self, name: str, value: str) -> bool:
        if len(value) <= MAX_LABEL_VALUE:
            return True
        self._refuse(name, f"label {name!r} is longer than {MAX_LABEL_VALUE} characters")
        return False

    def _refuse(self, name: str, why: str) -> None:
        """Logged once per name; a job that makes up new bad names is not remembered forever."""
        if name in self._refused or len(self._refused) >= MAX_REFUSED:
            return
        self._refused.add(name)
        log.warning("gpuwatch: %s (job %s); left out", why, self.job)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            with self._sends:  # the values and the number together: flush() waits for these
                self._started += 1
                number = self._started
                with self._lock:
                    metrics = dict(self._latest)
            ok = False
            try:
                ok = bool(metrics) and self._send(metrics)
            except Exception as exc:  # whatever it was, the next report tries again
                self._failed(f"{type(exc).__name__}: {exc}")
            with self._sends:
                self._finished, self._last_ok = number, ok
                self._sends.notify_all()
        if self._conn is not None:  # this thread's own, closed by it whenever it ends
            self._conn.close()

    def _connection(self) -> http.client.HTTPConnection:
        if self.url is None:
            return UnixHTTPConnection(self.socket_path)
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"url must be http://host:port or https://host:port, got {self.url!r}")
        if parts.scheme == "https":
            context = ssl.create_default_context(cafile=self.ca_file)
            return http.client.HTTPSConnection(parts.netloc, timeout=TIMEOUT_S, context=context)
        return http.client.HTTPConnection(parts.netloc, timeout=TIMEOUT_S)

    def _send(self, metrics: dict[str, float]) -> bool:
        """One push of the newest values; True when the daemon took it."""
        body = json.dumps(
            {
                "job": self.job,
                "labels": self.labels,
                "metrics": {k: _json_value(v) for k, v in metrics.items()},
            }
        )
        headers = {"Content-Type": "application/json"}
        if self.url is not None and self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            connection = self._conn or self._connection()
        except (OSError, ValueError) as exc:  # a bad URL or CA file: every send fails alike
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        self._conn = connection
        try:
            status, reply = self._post(connection, body, headers)
        except (OSError, http.client.HTTPException) as exc:
            # The daemon is away, or something else answers there: try again later.
            connection.close()
            self._failed(f"{type(exc).__name__}: {exc}")
            return False
        if status == 200:
            self.sent += 1
            if self._failing:
                log.info("gpuwatch takes this job's reports again (%s)", self._where())
            self._failing = False
            self._take_advice(reply)
            return True
        why = reply[:200].decode("utf-8", "replace")
        self._failed(f"HTTP {status}: {why}")
        return False

    @staticmethod
    def _post(
        connection: http.client.HTTPConnection, body: str, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """The push over the kept connection; once more on a new one (the connection opens
        itself again) when the daemon had closed the kept one: idle, or restarted. A daemon
        that does not answer in time is not asked twice."""
        reused = connection.sock is not None
        try:
            connection.request("POST", "/api/v1/push", body, headers)
            response = connection.getresponse()
            return response.status, response.read()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            if not reused or isinstance(exc, TimeoutError):
                raise
        connection.request("POST", "/api/v1/push", body, headers)
        response = connection.getresponse()
        return response.status, response.read()

    def _take_advice(self, reply: bytes) -> None:
        """The answer's `data.checkpoint`, if any: the advice, and the callback on its start."""
        try:
            advice = json.loads(reply)["data"].get("checkpoint") or {}
            reasons = [str(r)[:100] for r in advice.get("reasons", [])[:8]]
        except (ValueError, KeyError, TypeError, AttributeError):
            return  # an older daemon, or something else answering: no advice
        started = reasons and not self._advice
        self._advice = reasons
        if started and self._on_advice is not None:
            try:
                self._on_advice(list(reasons))
            except Exception:  # the job's callback must not stop its reports
                log.exception("on_checkpoint_advice raised")

    def _where(self) -> str:
        return self.url or self.socket_path

    def _failed(self, why: str) -> None:
        self.failed += 1
        if not self._failing:
            log.warning(
                "gpuwatch did not take a report of job %s (%s): %s; trying again every %gs, "
                "not logged again until one gets through",
                self.job,
                self._where(),
                why,
                self.interval,
            )
        self._failing = True
