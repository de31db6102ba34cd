"""What operators type for a daemon: a URL, `host:port`, or a host alone, as the `--hosts`
file always took them. A malformed address is a usage error with an exit status of its own:
never 3, which the health check and scripts read as "the daemon is down"."""

from __future__ import annotations

import re
import urllib.parse

DEFAULT_PORT = 10040
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\]")
WHAT = "expected HOST, HOST:PORT, [IPv6]:PORT or an http:// or https:// URL"


def daemon_url(text: str) -> str:
    """`text` as a daemon's base URL: `http://HOST:10040` for a host alone, `http://HOST:PORT`
    for `HOST:PORT`, a URL as it is. ValueError, naming what was typed, for anything else."""
    typed = text.strip()
    url = typed if "://" in typed else f"http://{typed}"
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises for a port that is no number, or out of range
    except ValueError:
        raise ValueError(f"{typed!r} is not a daemon's address: {WHAT}") from None
    host = parts.netloc.rsplit("@", 1)[-1]
    if port is not None:
        host = host.rsplit(":", 1)[0]
    if parts.scheme not in ("http", "https") or not _HOST.fullmatch(host):
        raise ValueError(f"{typed!r} is not a daemon's address: {WHAT}")
    if "://" in typed:
        return typed.rstrip("/")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(f"{typed!r} is not a daemon's address: {WHAT} (a path needs the URL)")
    return f"http://{parts.netloc}" + ("" if port is not None else f":{DEFAULT_PORT}")
