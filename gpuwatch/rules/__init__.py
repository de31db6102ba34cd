"""Prometheus rule files on the node: loading, alert state, evaluation and unit tests."""
