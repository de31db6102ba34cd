"""What the host's kernel tells beside NVML: processes on the GPUs, the boot."""
