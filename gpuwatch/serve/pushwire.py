"""A push socket request as it arrives, and an answer as it leaves: the bytes of HTTP/1.1 the
push socket's own server (pushserver.py) reads and writes."""

from __future__ import annotations

import json
import logging
import math
import urllib.parse
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from gpuwatch.model import Sample
from gpuwatch.push.parse import PushError

log = logging.getLogger(__name__)

Parsed = tuple[str, list[Sample]] | PushError  # a body read, or why not


def answer(
    status: int,
    payload: dict[str, Any],
    *,
    close: bool,
    allow: bool = False,
    retry_after: float | None = None,
) -> bytes:
    body = json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Content-Type: application/json; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        + ("Allow: POST\r\n" if allow else "")
        + (f"Retry-After: {math.ceil(retry_after)}\r\n" if retry_after is not None else "")
        + ("Connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode() + body


@dataclass
class Request:
    target: bytes
    content_type: str
    body: bytes
    keep_alive: bool
    refusal: tuple[int, str] | None  # decided from the head (path, method): body not kept

    def job(self) -> str | None:
        """`?job=` (the text format's); None without one."""
        if b"?" not in self.target:
            return None
        query = self.target.partition(b"?")[2].decode("latin-1")
        return urllib.parse.parse_qs(query, keep_blank_values=True).get("job", [None])[0]


def our_fault(exc: Exception) -> PushError:
    log.error("push socket: taking a push failed: %s", exc, exc_info=exc)
    return PushError(500, f"the daemon failed to take this push: {type(exc).__name__}")


class RefusedError(Exception):
    """(status, message): raised to stop parsing a request that is answered with it."""
