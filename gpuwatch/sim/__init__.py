"""The simulator: a fake `pynvml` driven by a simulated node and a scenario of timed faults."""
