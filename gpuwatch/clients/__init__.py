"""The command line and what it uses to reach a running daemon."""
