"""The default rule packs (Prometheus rule files), shipped with gpuwatch as package data."""
