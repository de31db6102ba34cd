"""Delivery for one receiver: the oldest notification in the outbox first, until a 2xx.

- 5xx, 408, timeouts and connection errors: retried with exponential backoff and jitter
  (1 s doubling to a 60 s cap), never skipping ahead, so notifications arrive in order.
- 429: retried when the service says (`Retry-After`, or Discord's `retry_after`), within
  0.25 s to 5 minutes: a service that answers "in a year" (or inf) must not silence its
  receiver for good, nor one that answers -5 or NaN draw a request every few milliseconds.
- Any other 4xx: the service refuses this message for good; it is dropped and logged.
- A per-receiver rate limit keeps under each service's own (Slack: one a second).
Each receiver has its own task, so one that is down holds up no other. The receiver's URL is
never logged: it often carries the credential.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import sqlite3
import time
from collections import Counter

from gpuwatch.clock import Clock, wait_event
from gpuwatch.compat import TIMEOUT_ERRORS
from gpuwatch.logs import fields as log_fields
from gpuwatch.notify.config import ReceiverConfig
from gpuwatch.notify.db import NotifyDb, Pending
from gpuwatch.web.fetch import CannotConnectError, fetch
from gpuwatch.web.plainhttp import HungUpError, UnsendableError

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
OUTBOX_RETRY_S = 5.0
RETRY_AFTER_MIN_S = 0.25
RETRY_AFTER_CAP_S = 300.0  # also the longest any outbox row waits, whatever it recorded


def backoff(attempts: int, rng: random.Random) -> float:
    """Exponential, capped, with equal jitter: half fixed, half random."""
    delay = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0 ** min(attempts, 32))
    return delay / 2 + rng.uniform(0, delay / 2)


def retry_after(headers: dict[str, str], body: bytes, now_wall: float) -> float | None:
    """Seconds to wait, from Retry-After (seconds or an HTTP date) or Discord's JSON, within
    RETRY_AFTER_MIN_S..RETRY_AFTER_CAP_S; None (back off as for an error) where there is none
    or it is negative, NaN or infinite."""
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), "").strip()
    seconds: float | None = None
    if value:
        try:
            seconds = float(value)
        except ValueError:
            # Imported here: receivers send seconds, and the module costs the daemon 1.5 MiB.
            import email.utils

            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - now_wall
            except (TypeError, ValueError, OverflowError):
                seconds = None
            else:
                seconds = max(0.0, seconds)  # a date gone by: now
    if seconds is None:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("retry_after"), int | float):
            seconds = float(data["retry_after"])
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return None
    return min(RETRY_AFTER_CAP_S, max(RETRY_AFTER_MIN_S, seconds))


def wait_for_head(next_attempt: float, now: float) -> float:
    """How long until an outbox row's next attempt: never more than RETRY_AFTER_CAP_S, so a
    row an older release scheduled for ever (`inf`) or far ahead is tried again."""
    wait = next_attempt - now
    return wait if wait <= RETRY_AFTER_CAP_S else RETRY_AFTER_CAP_S


class ReceiverSender:
    def __init__(
        self,
        receiver: ReceiverConfig,
        db: NotifyDb,
        clock: Clock,
        counts: Counter[tuple[str, str]],
        url: str,
    ) -> None:
        self.receiver = receiver
        self.db = db
        self.clock = clock
        self.counts = counts
        self.url = url
        self.wake = asyncio.Event()
        self._rng = random.Random()
        self._last_send = float("-inf")

    async def run(self, headers: dict[str, str]) -> None:
        """Deliver this receiver's queue, each request with `headers` besides its own."""
        while True:
            try:
                await self._next(headers)
            except (sqlite3.Error, OSError) as exc:
                # The outbox cannot be read or updated (a full disk): what was not marked
                # delivered is sent again later, which the Idempotency-Key makes harmless.
                log.error(
                    "outbox: %s; trying again in %.0fs",
                    exc,
                    OUTBOX_RETRY_S,
                    extra=log_fields(receiver=self.receiver.name),
                )
                await self._sleep(OUTBOX_RETRY_S)

    async def _next(self, headers: dict[str, str]) -> None:
        """Deliver the head of this receiver's queue if it is due; otherwise wait for it."""
        name = self.receiver.name
        item = self.db.head(name)
        now = self.clock.now()
        wait = None if item is None else wait_for_head(item.next_attempt, now)
        if item is not None and self.receiver.rate_limit > 0:
            wait = max(wait or 0.0, self._last_send + 1 / self.receiver.rate_limit - now)
        if wait is None or wait > 0:
            await self._sleep(wait)
            return
        assert item is not None
        self._last_send = now
        try:
            await self._deliver(headers, item)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not stop this receiver's deliveries for good
            log.exception("delivery failed unexpectedly", extra=log_fields(receiver=name))
            self.db.retry_at(item.id, self.clock.now() + backoff(item.attempts, self._rng))

    async def _sleep(self, seconds: float | None) -> None:
        self.wake.clear()
        await wait_event(self.clock, self.wake, seconds)

    async def _deliver(self, common: dict[str, str], item: Pending) -> None:
        name = self.receiver.name
        try:
            answer = await fetch(
                "POST",
                self.url,
                body=item.body,
                headers={**common, **item.headers},
                timeout=self.receiver.timeout,
                lane="notify",
            )
        except UnsendableError:  # never sendable: kept, it would hold up every later one
            self.db.delivered(item.id)
            self.counts[(name, "rejected")] += 1
            log.error(
                "a notification cannot be sent as HTTP (a header with a line break or a "
                "control character); dropped it (key %s)",
                item.key,
                extra=log_fields(receiver=name),
            )
            return
        except (ValueError, OSError) as exc:  # TimeoutError is an OSError
            self._retry(item, _why(exc, self.receiver.timeout), None)
            return
        status, headers, body = answer.status, answer.headers, answer.body
        if 200 <= status < 300:
            self.db.delivered(item.id)
            self.counts[(name, "sent")] += 1
            if item.attempts:
                log.info(
                    "delivered after %d retries", item.attempts, extra=log_fields(receiver=name)
                )
            return
        if status == 429:
            self.counts[(name, "throttled")] += 1
            wait = retry_after(headers, body, time.time())
            self._retry(item, "HTTP 429", wait, count=False)
            return
        if status >= 500 or status == 408:
            self._retry(item, f"HTTP {status}", None)
            return
        self.db.delivered(item.id)  # refused for good: keeping it would block every later one
        self.counts[(name, "rejected")] += 1
        log.error(
            "refused a notification for good: HTTP %d %s; dropped it (key %s)",
            status,
            body[:200].decode("utf-8", "replace"),
            item.key,
            extra=log_fields(receiver=name),
        )

    def _retry(self, item: Pending, why: str, wait: float | None, count: bool = True) -> None:
        if count:
            self.counts[(self.receiver.name, "failed")] += 1
        delay = wait if wait is not None else backoff(item.attempts, self._rng)
        if item.attempts == 0 or item.attempts % 10 == 0:
            log.warning(
                "not delivered (%s); attempt %d, next in %.1fs",
                why,
                item.attempts + 1,
                delay,
                extra=log_fields(receiver=self.receiver.name),
            )
        self.db.retry_at(item.id, self.clock.now() + delay)


def _why(exc: BaseException, timeout: float) -> str:
    """Why a delivery failed, in words, and never with the URL (a chat webhook's path is
    its secret)."""
    if isinstance(exc, TIMEOUT_ERRORS):
        return f"no answer within {timeout:g}s"
    if isinstance(exc, CannotConnectError):
        return f"cannot connect to {exc.host}:{exc.port}: {exc.why}"
    if isinstance(exc, HungUpError):
        return "the receiver closed the connection without an answer"
    if isinstance(exc, OSError) and exc.errno:
        return f"connection failed: {os.strerror(exc.errno)}"
    if isinstance(exc, ValueError):  # not an HTTP answer; the text never holds the URL
        return f"not an HTTP answer: {str(exc)[:120]}"
    return type(exc).__name__
