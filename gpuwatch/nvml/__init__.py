"""The NVML source: GPU sampling through pynvml."""
