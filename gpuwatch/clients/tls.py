"""How the command-line clients (`status`, `health`, `events`, `tui`) reach a daemon behind the
listener's web config: https with the fleet's own CA (`--ca-file`), and basic auth from the
URL's user:password@.

One GET through http.client, not urllib.request: the commands run before every job and at
every health-check interval, and urllib.request's import (its handlers, cookies, proxies,
mimetypes) cost them about a fifth of their time. Its errors are the ones urlopen raises:
HTTPError for an answer of 400 or more, URLError around what kept the request from one."""

from __future__ import annotations

import base64
import http.client
import ssl
import urllib.error
from typing import IO
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The system's CAs, or only `ca_file`'s when given. Raises OSError or ssl.SSLError."""
    return ssl.create_default_context(cafile=ca_file)


def basic_auth(parts: SplitResult) -> str | None:
    """The Authorization header for a URL's user:password@, or None without one."""
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def host_and_port(parts: SplitResult) -> str:
    """The URL's host[:port], without user:password@ (an IPv6 address in brackets)."""
    host = parts.hostname or ""
    return (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")


def open_url(url: str, ca_file: str | None, timeout: float) -> IO[bytes]:
    """The answer to a GET of `url`, to read and close. urllib.error.HTTPError for an answer
    of 400 or more, URLError (its `reason` the OSError) when none came."""
    parts = urlsplit(url)
    headers = {"Accept": "application/json"}
    authorization = basic_auth(parts)
    if authorization is not None:
        headers["Authorization"] = authorization
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        context = tls_context(ca_file)
        connection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=context
        )
    elif parts.scheme == "http":
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    else:
        raise urllib.error.URLError(f"unknown url type: {parts.scheme}")
    target = urlunsplit(("", "", parts.path or "/", parts.query, ""))
    try:
        connection.request("GET", target, headers=headers)
        response = connection.getresponse()
    except OSError as exc:
        connection.close()
        raise urllib.error.URLError(exc) from exc
    if response.status >= 400:
        raise urllib.error.HTTPError(url, response.status, response.reason, response.msg, response)
    return response


def redact(url: str) -> str:
    """The URL to show in messages: a password in it is replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
