"""The NVML source: GPU sampling through pynvml (or the simulator's fake of it)."""
