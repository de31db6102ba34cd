"""`POST /api/v1/push`: on the control socket always; on the TCP listener only with the
configured bearer token. Text format needs `?job=NAME`; JSON names its job in the body."""

from __future__ import annotations

import hmac
import logging

from aiohttp import web

from gpuwatch.notify.secrets import Secret
from gpuwatch.push.jobs import JobInputs
from gpuwatch.push.parse import PushError, check_job, parse_json, parse_text

log = logging.getLogger(__name__)


async def _body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise PushError(
            413,
            f"body of {request.content_length} bytes; the limit is {limit} (push.max_body_bytes)",
        )
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(65536):
        size += len(chunk)
        if size > limit:
            raise PushError(413, f"body over {limit} bytes (push.max_body_bytes)")
        chunks.append(chunk)
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
    try:
        body = await _body(request, jobs.pushed.limits.max_body_bytes)
        if request.content_type == "application/json":
            job, samples = parse_json(body)
        else:
            job = check_job(request.query.get("job"))
            samples = parse_text(body, job)
        count = jobs.pushed.apply(job, samples, now)
    except PushError as exc:
        return error_response(exc)
    return web.json_response({"status": "success", "data": {"job": job, "series": count}})


def error_response(exc: PushError) -> web.Response:
    log.info("push refused (%d): %s", exc.status, exc)
    return web.json_response(
        {"status": "error", "errorType": "bad_data", "error": str(exc)}, status=exc.status
    )
