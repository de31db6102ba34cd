"""HTTP/1.1 of our own: the daemon's server (the listener and the control socket) and the
clients the daemon and the commands ask with. Nothing here is imported by this file, so a
command that needs only the plain client loads only that."""
