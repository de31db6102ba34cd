"""The read-only HTTP listener: landing page, /metrics, /healthz and the JSON API."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.clock import within
from gpuwatch.exporters.prometheus import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    MetricsRenderer,
    wants_openmetrics,
)
from gpuwatch.metrics import CATALOGUE, MetricDef, pushed
from gpuwatch.model import Event
from gpuwatch.push.http import authorized, error_response, handle_push
from gpuwatch.push.parse import PushError
from gpuwatch.rules.views import alerts_payload, rules_payload
from gpuwatch.serve.connlimit import (
    ACCEPT_PER_TURN,
    IDLE_TIMEOUT_S,
    MAX_STREAMS,
    ConnectionCap,
    widen_backlog,
)
from gpuwatch.serve.payloads import (
    GPU_PREFIX,
    MAX_EVENTS,
    MAX_HISTORY_POINTS,
    downsample,
    gpus_payload,
    landing_page,
    node_payload,
    sample_text,
    summarize_gpus,
)
from gpuwatch.serve.readers import NodeState, ReaderOptions
from gpuwatch.serve.tlssite import SniffingTlsSite
from gpuwatch.serve.webconfig import WebGuard
from gpuwatch.state.journal import event_json
from gpuwatch.text.timefmt import parse_since, rfc3339
from gpuwatch.text.units import format_duration, parse_duration
from gpuwatch.web.app import App, Handler
from gpuwatch.web.message import (
    Answer,
    Request,
    Response,
    StreamResponse,
    json_response,
)
from gpuwatch.web.server import HttpServer

log = logging.getLogger(__name__)

STREAM_BACKLOG = 256  # events held for one stream client; more drop the oldest
STREAM_WRITE_TIMEOUT_S = 10.0
STREAM_KEEPALIVE_S = 15.0
SHUTDOWN_S = 1.0  # how long open requests (event streams) may finish when the daemon stops
MAX_BODY_BYTES = 64 * 1024


def _success(data: Any) -> Response:
    return json_response({"status": "success", "data": data})


def _bad_request(message: str) -> Response:
    return _error(message, 400, "bad_data")


def _error(message: str, status: int, error_type: str) -> Response:
    return json_response(
        {"status": "error", "errorType": error_type, "error": message}, status=status
    )


class Api:
    def __init__(self, options: ReaderOptions, cap: ConnectionCap | None = None) -> None:
        self.options = options
        self.renderer = MetricsRenderer(
            options.store, options.clock, self._describe, options.serving
        )
        self.cap = cap if cap is not None else ConnectionCap()

    def _describe(self, name: str) -> MetricDef | None:
        """TYPE and HELP for /metrics: the catalogue's, else a job's pushed metric's."""
        found = CATALOGUE.get(name)
        if found is None and name in self.options.jobs.pushed.names:
            return pushed(name, self._on_page)
        return found

    def _on_page(self, name: str) -> bool:
        """A metric of that name is on /metrics: pushed, the daemon's own, or recorded."""
        pushed_names = self.options.jobs.pushed.names
        # Asked from the render's thread: a lookup, not an iteration of a family that the
        # event loop may be adding to.
        return name in pushed_names or name in CATALOGUE or self.options.store.has(name)

    def app(self, guard: WebGuard | None = None) -> App:
        """The routes; behind `guard` (basic auth, headers) when a web-config file is used."""
        middlewares = [self._errors]
        if guard is not None:
            middlewares.insert(0, guard.middleware)
        app = App(middlewares, client_max_size=MAX_BODY_BYTES)
        app.add_get("/", self.landing)
        app.add_get("/metrics", self.metrics)
        app.add_get("/healthz", self.healthz)
        app.add_get("/api/v1/node", self.node)
        app.add_get("/api/v1/gpus", self.gpus)
        app.add_get("/api/v1/jobs/{job}/report", self.job_report)
        app.add_get("/api/v1/history", self.history)
        app.add_get("/api/v1/alerts", self.alerts)
        app.add_get("/api/v1/events", self.events)
        app.add_get("/api/v1/rules", self.rules)
        app.add_post("/api/v1/push", self.push, self._push_limit, self._push_token)
        app.add_get("/api/v1/stream", self.stream)
        return app

    def _push_limit(self) -> int:
        return self.options.jobs.pushed.limits.max_body_bytes

    def _push_token(self, request: Request) -> Response | None:
        """Refused from its head without the token: its body is never read."""
        try:
            authorized(request, self.options.node.config.push.token)
        except PushError as exc:
            return error_response(exc, request, request.query.get("job", ""))
        return None

    async def push(self, request: Request) -> Response:
        """Job metrics over TCP: only with the configured bearer token (checked from the
        head, before the body is read)."""
        return await handle_push(request, self.options.jobs, self.options.clock.now())

    async def _errors(self, request: Request, handler: Handler) -> Answer:
        try:
            return await handler(request)
        except Exception:  # one bad request must never take the daemon down
            log.exception("request failed path=%s", request.path)
            return json_response(
                {
                    "status": "error",
                    "errorType": "internal",
                    "error": "internal error; see the daemon log",
                },
                status=500,
            )

    async def landing(self, request: Request) -> Response:
        return Response(text=landing_page(node_payload(self.options)), content_type="text/html")

    async def metrics(self, request: Request) -> Response:
        openmetrics = wants_openmetrics(request.headers.get("Accept", ""))
        gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
        body = await self.renderer.render(openmetrics, gzipped)
        content_type = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
        response = Response(body=body, content_type=content_type)
        if gzipped:
            response.headers["Content-Encoding"] = "gzip"
        return response

    async def healthz(self, request: Request) -> Response:
        return healthz_response(self.options.node)

    async def node(self, request: Request) -> Response:
        """`?gpus=summary` trims each GPU to what a fleet view shows (a tenth of the bytes)."""
        payload = node_payload(self.options)
        if request.query.get("gpus") == "summary":
            payload["gpus"] = summarize_gpus(payload["gpus"])
        return _success(payload)

    async def job_report(self, request: Request) -> Response:
        """A job's report: per GPU, what happened while it ran there (404: not seen here)."""
        job = request.match_info["job"]
        reports = self.options.reports
        made = reports.report(job) if reports is not None else None
        if made is None:
            message = f"no job {job!r} ran on this node's GPUs while gpuwatch watched"
            return _error(message, 404, "not_found")
        return _success(made)

    async def gpus(self, request: Request) -> Response:
        return _success(gpus_payload(self.options))

    async def stream(self, request: Request) -> Answer:
        """Server-sent events: `cycle` after every sample (data: its time), and every journal
        event as it happens (event: its kind, data: the event's JSON). A client that reads
        nothing for STREAM_WRITE_TIMEOUT_S is dropped: it holds a bounded queue meanwhile."""
        if request.method == "HEAD":  # what a GET would begin with, and no stream
            return Response(content_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        streams = self.cap.streams
        if len(streams) >= MAX_STREAMS:
            return json_response(
                {"status": "error", "error": f"{MAX_STREAMS} event streams are open already"},
                status=503,
                headers={"Retry-After": "10"},
            )
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(maxsize=STREAM_BACKLOG)

        def put(kind: str, data: str) -> None:
            if queue.full():  # a reader that does not keep up loses the oldest, not the daemon
                queue.get_nowait()
            queue.put_nowait((kind, data))

        def on_event(event: Event) -> None:
            put(event.kind, json.dumps(event_json(event)))

        def on_cycle(t: float) -> None:
            put("cycle", json.dumps({"time": rfc3339(t)}))

        response = StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        connection = request.connection
        streams.add(connection)
        self.options.events.listeners.append(on_event)
        self.options.cycle_listeners.append(on_cycle)
        try:
            while True:
                try:
                    kind, data = await within(queue.get(), STREAM_KEEPALIVE_S)
                    chunk = f"event: {kind}\ndata: {data}\n\n".encode()
                except TimeoutError:
                    chunk = b": keepalive\n\n"
                await within(response.write(chunk), STREAM_WRITE_TIMEOUT_S)
        except TimeoutError:
            log.info(
                "event stream to %s dropped: it read nothing for %.0f s",
                request.remote,
                STREAM_WRITE_TIMEOUT_S,
            )
            connection.force_close()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            streams.discard(connection)
            self.options.events.listeners.remove(on_event)
            self.options.cycle_listeners.remove(on_cycle)
        return response

    async def alerts(self, request: Request) -> Response:
        engine = self.options.rules
        if engine is None:
            return _success({"alerts": []})
        # Between evaluations: a worker thread changes the rules' state while it evaluates,
        # and an alert shown firing has had its event published when the evaluation ends.
        async with engine.evaluating:
            return _success(alerts_payload(engine))

    async def events(self, request: Request) -> Response:
        q = request.query
        try:
            since = parse_since(q.get("since", "1h"), self.options.clock.now())
            limit = int(q.get("limit", str(MAX_EVENTS)))
        except ValueError as exc:
            return _bad_request(f"since/limit: {exc}")
        limit = max(1, min(limit, MAX_EVENTS))
        journal = self.options.journal
        if journal is None:
            found = [e for e in self.options.events.recent if e.time > since][-limit:]
        else:
            found = journal.events(since, limit, q.get("kind", ""))
        return _success({"events": [event_json(e) for e in found]})

    async def rules(self, request: Request) -> Response:
        engine = self.options.rules
        kind = request.query.get("type", "")
        if kind not in ("", "alert", "record"):
            return _bad_request("parameter 'type' must be 'alert' or 'record'")
        if engine is None:
            return _success({"groups": []})
        async with engine.evaluating:  # as alerts(): between evaluations
            return _success(rules_payload(engine, kind))

    async def history(self, request: Request) -> Response:
        q = request.query
        metric = q.get("metric", "")
        if not metric:
            example = "gpuwatch_gpu_temperature_celsius"
            return _bad_request(f"missing parameter 'metric' (a metric name such as {example})")
        name = metric if metric.startswith("gpuwatch_") else GPU_PREFIX + metric
        try:
            window = parse_duration(q.get("range", "1h"))
            step = parse_duration(q["step"]) if "step" in q else 0.0
        except ValueError as exc:
            return _bad_request(f"range/step: {exc}")
        if window <= 0:
            return _bad_request("range must be greater than zero")
        gpu = q.get("gpu")
        end = self.options.clock.now()
        start = end - window
        if step and window / step > MAX_HISTORY_POINTS:
            return _bad_request(
                f"range/step gives more than {MAX_HISTORY_POINTS} points; use a larger step"
            )
        result: list[tuple[dict[str, str], list[list[float | str]]]] = []
        for series in self.options.store.select(name):
            labels = series.label_dict
            if gpu is not None and labels.get("gpu") != gpu:
                continue
            points = series.samples(start, end)
            if step:
                points = downsample(points, start, step)
            identity = {"__name__": series.name, **labels}
            values: list[list[float | str]] = [
                [t, sample_text(v)] for t, v in points[-MAX_HISTORY_POINTS:]
            ]
            result.append((identity, values))
        result.sort(key=lambda r: (r[0].get("gpu", ""), sorted(r[0].items())))
        return _success(
            {
                "resultType": "matrix",
                "result": [{"metric": labels, "values": values} for labels, values in result],
                "range": format_duration(window),
                "step": step or None,
            }
        )


@dataclass
class Listener:
    """The listener as started: its server, and the TLS sites accepting for it."""

    server: HttpServer
    sites: list[SniffingTlsSite] = field(default_factory=list)

    async def cleanup(self) -> None:
        for site in self.sites:
            await site.stop()
        await self.server.stop()


async def start_http(
    api: Api, sockets: list[socket.socket], guard: WebGuard | None = None
) -> Listener:
    """Serve the API on the bound `sockets` (over TLS when the guard's web config has it)."""
    # Open event streams are cut after a second at shutdown, not waited on for a minute.
    server = HttpServer(
        api.app(guard),
        idle_timeout=IDLE_TIMEOUT_S,
        request_timeout=IDLE_TIMEOUT_S,
        shutdown_timeout=SHUTDOWN_S,
        cap=api.cap,
    )
    listener = Listener(server)
    server.start()
    tls = guard.config.tls if guard is not None else None
    if tls is not None:  # answers plain HTTP too, as Go's exporters do
        for sock in sockets:
            site = SniffingTlsSite(server.factory, sock, tls)
            await site.start()
            listener.sites.append(site)
        return listener
    for sock in sockets:
        await server.serve_socket(sock, ACCEPT_PER_TURN)
    widen_backlog(sockets)
    return listener


def healthz_response(node: NodeState) -> Response:
    """200 while samples keep coming, 503 once they stop: whether the daemon works, not
    whether the GPUs do (a liveness probe that failed on a sick GPU would restart the daemon
    in a loop instead of reporting it). Served on the listener and on the control socket."""
    problem = node.sampling_problem()
    body = {
        "status": "stale" if problem else "ok",
        "problem": problem,
        "last_sample_time": node.last_cycle_end,
    }
    return json_response(body, status=503 if problem else 200)
