"""Assembling and serving the daemon: wiring, HTTP, the control socket, reload, systemd."""
