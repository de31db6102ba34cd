"""Prometheus exposition of gpuwatch's store (imported as gpuwatch.exporters)."""
