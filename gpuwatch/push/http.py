"""`POST /api/v1/push`: on the control socket always; on the TCP listener only with the
configured bearer token. Text format needs `?job=NAME`; JSON names its job in the body."""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging

from aiohttp import web

from gpuwatch.model import Sample
from gpuwatch.notify.secrets import Secret
from gpuwatch.push.jobs import JobInputs
from gpuwatch.push.parse import PushError, check_job, parse_json, parse_text, sample_lines

log = logging.getLogger(__name__)

BODY_TIMEOUT_S = 30.0
PARSE_ON_LOOP_BYTES = 64 * 1024  # a training job's usual push: parsed at once, no thread hop


async def _body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise PushError(
            413,
            f"body of {request.content_length} bytes; the limit is {limit} (push.max_body_bytes)",
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_TIMEOUT_S):  # a body trickled in holds a connection
            while chunk := await request.content.read(65536):
                size += len(chunk)
                if size > limit:
                    raise PushError(413, f"body over {limit} bytes (push.max_body_bytes)")
                chunks.append(chunk)
    except TimeoutError:
        raise PushError(408, f"body not received within {BODY_TIMEOUT_S:.0f} s") from None
    return b"".join(chunks)


def authorized(request: web.Request, token: Secret | None) -> None:
    """Raise PushError unless a TCP request carries the configured bearer token."""
    if token is None:
        raise PushError(403, "pushing over TCP is off: set push.token, or push on the unix socket")
    given = request.headers.get("Authorization", "")
    expected = f"Bearer {token.reveal()}"
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise PushError(401, "missing or wrong bearer token (Authorization: Bearer ...)")


async def handle_push(request: web.Request, jobs: JobInputs, now: float) -> web.Response:
    limits = jobs.pushed.limits
    try:
        body = await _body(request, limits.max_body_bytes)
        if request.content_type == "application/json":
            parse = functools.partial(parse_json, body)
        else:
            job = check_job(request.query.get("job"))
            lines = sample_lines(body)  # a cheap upper bound, before any parsing
            if lines > limits.max_series_per_job:
                raise PushError(
                    422,
                    f"too many series: {lines} sample lines for job {job!r}, the limit per job"
                    f" is {limits.max_series_per_job} (push.max_series_per_job)",
                )
            parse = functools.partial(_parse_text_of, body, job)
        # A large body is parsed on a thread: the event loop keeps answering /healthz.
        if len(body) <= PARSE_ON_LOOP_BYTES:
            job, samples = parse()
        else:
            job, samples = await asyncio.to_thread(parse)
        count = jobs.pushed.apply(job, samples, now)
    except PushError as exc:
        return error_response(exc)
    return web.json_response({"status": "success", "data": {"job": job, "series": count}})


def _parse_text_of(body: bytes, job: str) -> tuple[str, list[Sample]]:
    return job, parse_text(body, job)


def error_response(exc: PushError) -> web.Response:
    log.info("push refused (%d): %s", exc.status, exc)
    return web.json_response(
        {"status": "error", "errorType": "bad_data", "error": str(exc)}, status=exc.status
    )
