"""How the command-line clients (`status`, `health`, `events`, `tui`) reach a daemon behind the
listener's web config: https with the fleet's own CA (`--ca-file`), and basic auth from the
URL's user:password@, which urllib would otherwise take for part of the host."""

from __future__ import annotations

import base64
import ssl
import urllib.request
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
    parts = urlsplit(url)
    headers = {"Accept": "application/json"}
    authorization = basic_auth(parts)
    if authorization is not None:
        headers["Authorization"] = authorization
        url = urlunsplit(parts._replace(netloc=host_and_port(parts)))
    context = tls_context(ca_file) if parts.scheme == "https" else None
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=timeout, context=context)  # type: ignore[no-any-return]


def redact(url: str) -> str:
    """The URL to show in messages: a password in it is replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")))
