"""The listener's TCP sockets, bound before anything else is built: the port is then known
(the kernel's choice when the config says 0) to everything that links back to the daemon,
such as alert links and the notifier's external URL."""

from __future__ import annotations

import contextlib
import socket


def bind_tcp(host: str, port: int) -> list[socket.socket]:
    """One socket per address `host` resolves to, as asyncio's create_server binds them; with
    port 0, every address gets the port the first one was given."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    out: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # each family its own socket, as asyncio does
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            same_port = port == 0 and len(out) > 1
            sock.bind((address[0], out[0].getsockname()[1], *address[2:]) if same_port else address)
            sock.setblocking(False)
    except OSError:
        for sock in out:
            with contextlib.suppress(OSError):
                sock.close()
        raise
    return out
