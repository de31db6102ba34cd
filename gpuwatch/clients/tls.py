"""How the command-line clients (`status`, `health`, `events`, `tui`) reach a daemon behind the
listener's web config: https with the fleet's own CA (`--ca-file`), and basic auth from the
URL's user:password@.

One GET, not urllib.request: the commands run before every job and at every health-check
interval, and urllib.request's import (its handlers, cookies, proxies, mimetypes) cost them
about a fifth of their time. An http:// URL is asked on a socket (web/plainhttp.py);
http.client and ssl, which cost another 20 ms to import, only for https. It keeps what urlopen
did that a daemon's address can need (redirects, as a reverse proxy in front of the daemon
sends; its errors, which the commands explain) and leaves out the rest: proxies from the
environment (http_proxy, https_proxy) are not used, as the dashboard never used them, since a
daemon is reached on the node's or the fleet's own network."""

from __future__ import annotations

import urllib.error
from typing import IO, TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import SplitResult, urljoin, urlsplit, urlunsplit

from gpuwatch import __version__
from gpuwatch.web import plainhttp

REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 10  # urllib's HTTPRedirectHandler's limits
MAX_REPEATS = 4
LOOP = "The HTTP server returned a redirect error that would lead to an infinite loop."
USER_AGENT = f"gpuwatch/{__version__}"


if TYPE_CHECKING:
    import ssl
    from types import TracebackType


class Answer(Protocol):
    """An answer to a GET, to read and close: http.client's, or plainhttp's."""

    status: int
    reason: str
    msg: Any

    def getheader(self, name: str) -> str | None: ...
    def read(self, size: int = -1) -> bytes: ...
    def close(self) -> None: ...
    def __enter__(self) -> Any: ...
    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> None: ...


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The system's CAs, or only `ca_file`'s when given. Raises OSError or ssl.SSLError."""
    import ssl

    return ssl.create_default_context(cafile=ca_file)


def open_url(url: str, ca_file: str | None, timeout: float) -> Answer:
    """The answer to a GET of `url`, to read and close, following redirects as urlopen does
    (at most MAX_REDIRECTS, a URL at most MAX_REPEATS times). urllib.error.HTTPError for an
    answer of 400 or more, or a redirect that goes nowhere; URLError (its `reason` the error)
    when the request could not be sent or the answer is not HTTP; what reading the answer
    raised otherwise (plainhttp.HungUpError: a TLS listener hanging up on plain HTTP)."""
    seen: dict[str, int] = {}
    while True:
        response = _get(url, ca_file, timeout)
        location = response.getheader("Location")
        if response.status not in REDIRECTS or location is None:
            break
        response.close()
        target = urljoin(url, location)
        seen[target] = seen.get(target, 0) + 1
        if seen[target] > MAX_REPEATS or len(seen) > MAX_REDIRECTS:
            message = f"{LOOP}\nThe last 30x error message was:\n{response.reason}"
            raise urllib.error.HTTPError(redact(url), response.status, message, response.msg, None)
        if urlsplit(target).scheme not in ("http", "https"):
            message = f"redirection to a URL that is not http or https: {redact(target)}"
            raise urllib.error.HTTPError(redact(url), response.status, message, response.msg, None)
        url = target
    if response.status >= 400:
        raise urllib.error.HTTPError(
            redact(url), response.status, response.reason, response.msg, cast(IO[bytes], response)
        )  # HTTPError reads its body through read(): both answers have it
    return response


def _get(url: str, ca_file: str | None, timeout: float) -> Answer:
    """One GET and its answer, on a connection of its own."""
    parts = urlsplit(url)
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT, "Connection": "close"}
    authorization = plainhttp.basic_auth(parts)
    if authorization is not None:
        headers["Authorization"] = authorization
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    if parts.scheme == "http":
        try:
            return plainhttp.get(parts.hostname or "", parts.port or 80, target, headers, timeout)
        except plainhttp.NotHttpError as exc:
            raise urllib.error.URLError(f"the answer is not HTTP ({exc})") from exc
        except plainhttp.UnsendableError as exc:
            raise urllib.error.URLError(str(exc)) from exc
        except plainhttp.HungUpError:
            raise
        except OSError as exc:  # as urlopen: not sent, or no answer, URLError
            raise urllib.error.URLError(exc) from exc
    if parts.scheme == "https":
        return _get_tls(parts, target, headers, ca_file, timeout)
    raise urllib.error.URLError(f"unknown url type: {parts.scheme}")


def _get_tls(
    parts: SplitResult, target: str, headers: dict[str, str], ca_file: str | None, timeout: float
) -> Answer:
    import http.client

    # The port always given: http.client reads a bare IPv6 address's last group as one.
    connection = http.client.HTTPSConnection(
        parts.hostname or "", parts.port or 443, timeout=timeout, context=tls_context(ca_file)
    )
    try:
        connection.request("GET", target, headers=headers)
    except (OSError, http.client.HTTPException) as exc:  # as urlopen: not sent, URLError
        connection.close()
        raise urllib.error.URLError(exc) from exc
    try:
        return connection.getresponse()
    except http.client.RemoteDisconnected as exc:
        connection.close()
        raise plainhttp.HungUpError(str(exc)) from exc
    except http.client.HTTPException as exc:  # not OSError: an answer that is not HTTP
        connection.close()
        raise urllib.error.URLError(f"the answer is not HTTP ({exc!r})") from exc


def redact(url: str) -> str:
    """The URL to show in messages: a password in it is replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
