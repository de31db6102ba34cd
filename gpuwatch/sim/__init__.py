"""The simulator: a simulated NVML library beneath the real pynvml, driven by a simulated node
with a driver profile and a scenario of timed faults."""
