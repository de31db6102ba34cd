"""Routes and middleware: what answers a request, found by method and path, and the steps
every request passes through on its way there (a connection cap, a password check, an error
guard), each handed the next as `handler`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from gpuwatch.web.message import Answer, Request, Response, error_text

Handler = Callable[[Request], Awaitable[Answer]]
# Asked once a request's head is in, before its body is read: an answer refuses it there.
HeadCheck = Callable[[Request], Response | None]
Middleware = Callable[[Request, Handler], Awaitable[Answer]]
DEFAULT_MAX_BODY = 64 * 1024


@dataclass(frozen=True)
class Route:
    method: str
    parts: tuple[str, ...]  # the path's segments; "{name}" matches one segment, kept by name
    handler: Handler
    max_body: Callable[[], int] | None  # None: the app's
    head_check: HeadCheck | None = None

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.parts):
            return None
        found: dict[str, str] = {}
        for part, given in zip(self.parts, segments, strict=True):
            if part.startswith("{") and part.endswith("}"):
                if not given:
                    return None
                found[part[1:-1]] = given
            elif part != given:
                return None
        return found


@dataclass
class Found:
    handler: Handler
    match_info: dict[str, str]
    max_body: int
    own_limit: bool = False  # the handler answers a body over max_body itself
    head_check: HeadCheck | None = None


class App:
    def __init__(
        self, middlewares: Sequence[Middleware] = (), client_max_size: int = DEFAULT_MAX_BODY
    ) -> None:
        self.middlewares = list(middlewares)
        self.client_max_size = client_max_size
        self._exact: dict[tuple[str, str], Route] = {}
        self._patterns: list[Route] = []

    def add_get(self, path: str, handler: Handler) -> None:
        self._add("GET", path, handler, None)

    def add_post(
        self,
        path: str,
        handler: Handler,
        max_body: Callable[[], int] | None = None,
        head_check: HeadCheck | None = None,
    ) -> None:
        """`max_body`: the route's own limit, whose excess the handler answers itself;
        `head_check`: a refusal decided from the head (a missing token), sent without
        reading the body, which a client without the right could otherwise make the daemon
        hold up to the limit."""
        self._add("POST", path, handler, max_body, head_check)

    def add_delete(self, path: str, handler: Handler) -> None:
        self._add("DELETE", path, handler, None)

    def _add(
        self,
        method: str,
        path: str,
        handler: Handler,
        limit: Callable[[], int] | None,
        head_check: HeadCheck | None = None,
    ) -> None:
        route = Route(method, tuple(path.split("/")), handler, limit, head_check)
        if "{" in path:
            self._patterns.append(route)
        else:
            self._exact[(method, path)] = route

    def resolve(self, method: str, raw_path: str) -> Found:
        """The route for a request, or a handler answering 404 or 405 (HEAD asks as GET).
        A path's segments are matched decoded (%2F within one stays in it)."""
        asked = "GET" if method == "HEAD" else method
        segments = [unquote(s) for s in raw_path.split("/")]
        whole = _whole(segments)
        route = self._exact.get((asked, whole)) if whole is not None else None
        match_info: dict[str, str] | None = {}
        if route is None:
            route, match_info = self._pattern(asked, segments)
        if route is not None and match_info is not None:
            limit = route.max_body() if route.max_body is not None else self.client_max_size
            own = route.max_body is not None
            return Found(route.handler, match_info, limit, own, route.head_check)
        allowed = self._allowed(segments)
        if not allowed:
            return Found(_answer(error_text(404)), {}, self.client_max_size)
        refused = error_text(405)
        refused.headers["Allow"] = ", ".join(sorted(allowed))
        return Found(_answer(refused), {}, self.client_max_size)

    def _pattern(
        self, method: str, segments: list[str]
    ) -> tuple[Route | None, dict[str, str] | None]:
        for route in self._patterns:
            if route.method == method and (found := route.match(segments)) is not None:
                return route, found
        return None, None

    def _allowed(self, segments: list[str]) -> set[str]:
        path = _whole(segments)
        allowed = {m for m, p in self._exact if p == path}
        allowed |= {r.method for r in self._patterns if r.match(segments) is not None}
        return allowed

    async def handle(self, request: Request, found: Found) -> Answer:
        """The request through each middleware, in order, to its route's handler."""
        handler = found.handler
        if request.refusal is not None:
            handler = _answer(request.refusal)
        elif request.too_large and not found.own_limit:
            handler = _answer(error_text(413))
        for middleware in reversed(self.middlewares):
            handler = _wrapped(middleware, handler)
        return await handler(request)


def _whole(segments: list[str]) -> str | None:
    """The decoded path an exact route is found by; None when a segment holds an encoded
    slash, which no exact route's segments do."""
    return "/".join(segments) if not any("/" in s for s in segments) else None


def _wrapped(middleware: Middleware, handler: Handler) -> Handler:
    async def step(request: Request) -> Answer:
        return await middleware(request, handler)

    return step


def _answer(response: Response) -> Handler:
    async def fixed(request: Request) -> Answer:
        return Response(status=response.status, body=response.body, headers=response.headers)

    return fixed
