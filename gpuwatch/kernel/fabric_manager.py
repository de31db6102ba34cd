"""NVIDIA Fabric Manager, on a node with NVSwitches: whether it is up.

Fabric Manager configures the NVSwitches and registers each GPU in the NVLink fabric; without
it no GPU of an NVSwitch system (HGX/DGX A100, H100, H200, B200) can reach another over
NVLink, and a GPU that comes back from a reset is not registered again. It runs as the
`nvidia-fabricmanager` systemd service on the host, or inside the GPU operator's driver
container, so gpuwatch asks the one thing both share: whether its command port accepts a
connection (FM_CMD_PORT_NUMBER, 127.0.0.1:6666 unless fabricmanager.cfg says otherwise, or the
Unix socket of FM_CMD_UNIX_SOCKET_PATH). The connection is closed at once; nothing is sent.
"""

from __future__ import annotations

import socket

from gpuwatch.text.units import ascii_int

DEFAULT_ADDRESS = "127.0.0.1:6666"
TIMEOUT_S = 0.2  # a loopback connect answers at once, accepted or refused


def parse_address(value: str) -> tuple[int, str | tuple[str, int]]:
    """(address family, address) of `HOST:PORT` or an absolute Unix socket path; ValueError
    for anything else."""
    if value.startswith("/"):
        return socket.AF_UNIX, value
    host, sep, port_text = value.rpartition(":")
    port = ascii_int(port_text)
    if not sep or not host or port is None or not 0 < port < 65536:
        raise ValueError(f"expected HOST:PORT or a Unix socket path, got {value!r}")
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    return family, (host.strip("[]"), port)


def answers(address: str, timeout: float = TIMEOUT_S) -> bool:
    """Whether Fabric Manager accepts a connection at `address` now."""
    family, where = parse_address(address)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(where)
        except OSError:
            return False
    return True
