"""`POST /api/v1/push`: on the control socket always; on the TCP listener only with the
configured bearer token. Text format needs `?job=NAME`; JSON names its job in the body."""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any

from gpuwatch.logs import fields as log_fields
from gpuwatch.model import Sample
from gpuwatch.push.jobs import CheckpointAdvice, JobInputs
from gpuwatch.push.parse import (
    MAX_LABELS_PER_SERIES,
    PushError,
    check_job,
    parse_json,
    parse_text,
    text_shape,
)
from gpuwatch.push.registry import PushLimits
from gpuwatch.text.secrets import Secret
from gpuwatch.web.message import Request, Response, json_response

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 500  # of a refusal's reason, in the reply and the log line
PARSE_ON_LOOP_BYTES = 64 * 1024  # a training job's usual push: parsed at once, no thread hop
# Label pairs in one text push, counted before it is parsed: parsing is what a push costs
# (1000 series of 100 labels took 0.6 s of the interpreter), and a job's series carry a few.
MAX_LABEL_PAIRS = 20_000


def _body(request: Request, limit: int) -> bytes:
    """The body the server read, or why it is refused (the server reads up to the route's
    limit, push.max_body_bytes, and a request not whole in time is answered 408 by it)."""
    if request.too_large:
        length = request.content_length
        if length is not None and length > limit:
            message = f"body of {length} bytes; the limit is {limit} (push.max_body_bytes)"
        else:
            message = f"body over {limit} bytes (push.max_body_bytes)"
        raise PushError(413, message)
    return request.body


def authorized(request: Request, token: Secret | None) -> None:
    """Raise PushError unless a TCP request carries the configured bearer token."""
    if token is None:
        raise PushError(403, "pushing over TCP is off: set push.token, or push on the unix socket")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    # The scheme is case-insensitive (RFC 9110 11.1): curl users write "bearer" too.
    right = hmac.compare_digest(given.strip().encode(), token.reveal().encode())
    if scheme.lower() != "bearer" or not right:
        raise PushError(401, "missing or wrong bearer token (Authorization: Bearer ...)")


Parse = Callable[[], tuple[str, list[Sample]]]


def parser_for(body: bytes, content_type: str, query_job: str | None, limits: PushLimits) -> Parse:
    """What parses this body (JSON names its job, text takes `?job=`), after the checks that
    need no parsing; PushError when one fails. Shared by every endpoint that takes pushes."""
    if content_type == "application/json":
        return functools.partial(parse_json, body)
    job = check_job(query_job)
    shape = text_shape(body)  # cheap upper bounds, before any parsing
    if shape.lines > limits.max_series_per_job:
        raise PushError(
            422,
            f"too many series: {shape.lines} sample lines for job {job!r}, the limit per job"
            f" is {limits.max_series_per_job} (push.max_series_per_job)",
            job,
        )
    # A series' labels cost the parser more than linearly: bounded on each line, not only
    # in all. A `=` in a label value counts too; a series of 32 labels leaves room for it.
    if shape.most_on_a_line > 2 * MAX_LABELS_PER_SERIES or shape.equals > MAX_LABEL_PAIRS:
        raise PushError(
            422,
            f"too many labels for job {job!r}: {shape.equals} `=` in the push, "
            f"{shape.most_on_a_line} on one line; a push may have {MAX_LABEL_PAIRS} label "
            f"pairs, a series {MAX_LABELS_PER_SERIES}",
            job,
        )
    return functools.partial(_parse_text_of, body, job)


def accepted(job: str, count: int, advice: CheckpointAdvice | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"job": job, "series": count}
    if advice is not None:
        data["checkpoint"] = advice.as_json()
    return {"status": "success", "data": data}


def refused(exc: PushError, peer: str, job: str = "") -> dict[str, Any]:
    """The answer to a refused push, logged: the sender is a field, so one flooding client's
    lines are cut short without hiding another's first; the job is in the text (a flood of
    made-up job names stays one burst). The reason is cut short: the parsers' messages
    quote what they could not read, which can be a line of megabytes."""
    reason = str(exc)
    if len(reason) > MAX_REASON_CHARS:
        reason = f"{reason[:MAX_REASON_CHARS]}... ({len(reason)} characters)"
    log.info(
        "push refused (%d)%s: %s",
        exc.status,
        f" for job {job[:128]!r}" if job else "",
        reason,
        extra=log_fields(peer=peer),
    )
    return error_body(reason)


def error_body(message: str) -> dict[str, Any]:
    return {"status": "error", "errorType": "bad_data", "error": message}


# (samples, the sender's pid or None) -> the samples with the GPU they may speak for
Stamp = Callable[[list[Sample], int | None], list[Sample]]


def unstamped(samples: list[Sample], pid: int | None) -> list[Sample]:
    """Where no sender can be named (TCP), or none is asked: the samples as they came."""
    return samples


async def handle_push(
    request: Request, jobs: JobInputs, now: float, stamp: Stamp = unstamped
) -> Response:
    """A push over the daemon's HTTP server: the control socket's, whose sender the kernel
    names, and the TCP listener's (with the token), whose sender nobody can name."""
    limits = jobs.pushed.limits
    job = request.query.get("job", "")  # for the log line when refused; a JSON body names it
    try:
        body = _body(request, limits.max_body_bytes)
        parse = parser_for(body, request.content_type, request.query.get("job"), limits)
        # A large body is parsed on a thread: the event loop keeps answering /healthz.
        if len(body) <= PARSE_ON_LOOP_BYTES:
            job, samples = parse()
        else:
            job, samples = await asyncio.to_thread(parse)
        sock = request.transport.get_extra_info("socket") if request.transport else None
        count = jobs.pushed.apply(job, stamp(samples, peer_pid(sock)), now)
    except PushError as exc:
        return error_response(exc, request, exc.job or job)
    return json_response(accepted(job, count, jobs.advice))


def _parse_text_of(body: bytes, job: str) -> tuple[str, list[Sample]]:
    return job, parse_text(body, job)


def peer_creds(sock: socket.socket | None) -> tuple[int, int] | None:
    """(pid, uid) of the other end of a unix socket: the kernel's word for it (SO_PEERCRED),
    as every local sender has the same empty address."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


def peer_pid(sock: socket.socket | None) -> int | None:
    creds = peer_creds(sock)
    return creds[0] if creds is not None and creds[0] > 0 else None


def unix_peer(sock: socket.socket | None) -> str:
    return peer_text(peer_creds(sock))


def peer_text(creds: tuple[int, int] | None) -> str:
    """A sender on a unix socket as log lines name it, from its (pid, uid)."""
    return "unix socket" if creds is None else f"uid {creds[1]} pid {creds[0]}"


def error_response(exc: PushError, request: Request, job: str = "") -> Response:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    peer = request.remote or unix_peer(sock)
    return json_response(refused(exc, peer, job), status=exc.status)
