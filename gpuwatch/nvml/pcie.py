"""A GPU's PCIe traffic, as nvmlDeviceGetPcieThroughput measures it.

NVML has two ways to say how much a GPU moves over PCIe. Its byte counters (field values
197 and 198) are what a rate is best taken from, but an H200 on R580 answers them in 32 bits
(tests/fixtures/nvml/h200-r580.159.04.json): at Gen5 x16 they wrap several times a second, so
no two reads a cycle apart can say how much went by (gpuwatch.nvml.fields drops them).
nvmlDeviceGetPcieThroughput answers in KB/s what a byte counter moved over a 20 ms window
(nvml.h); the call waits out that window, 21 ms a call measured on the H200. Two calls (each
direction) hold a thread for 40 ms, so they never run in the cycle's runner, which reads every
GPU one after another; each GPU's lane reads its own, on its own turn (nvml/pcie_reads.py).

A 20 ms window is a sample of the traffic, not its mean; taken every few seconds at moments
unrelated to the job's steps, the samples' average over minutes is the traffic's mean, which
is how the rules read it (avg_over_time over 5 minutes).
"""

from __future__ import annotations

import logging
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.logs import fields as log_fields
from gpuwatch.model import Labels, Sample
from gpuwatch.nvml.errors import NvmlModule, missing_errors

log = logging.getLogger(__name__)

KB = 1024  # nvml.h's "KB/s", as nvidia-smi and NVIDIA's own samples divide it
# nvml.h's nvmlPcieUtilCounter_t, and the direction each becomes.
COUNTERS = (("NVML_PCIE_UTIL_TX_BYTES", "tx"), ("NVML_PCIE_UTIL_RX_BYTES", "rx"))


class PcieThroughput:
    """One GPU's PCIe throughput, both directions. A GPU or driver that does not support the
    call (a vGPU guest) is not asked again; any other error skips this read."""

    def __init__(self, nvml: NvmlModule, handle: Any, labels: Labels, gpu: int) -> None:
        self._nvml = nvml
        self._handle = handle
        self._gpu = gpu
        self._missing = missing_errors(nvml)
        self._call = getattr(nvml, "nvmlDeviceGetPcieThroughput", None)
        self._counters = [
            (getattr(nvml, name), (*labels, ("direction", direction)))
            for name, direction in COUNTERS
            if hasattr(nvml, name)
        ]
        self.supported = self._call is not None and bool(self._counters)

    def read(self) -> list[Sample]:
        """Bytes a second each way over the last 20 ms; [] where nothing answered. Runs in
        the GPU's lane (~40 ms, most of it waiting in the driver)."""
        out: list[Sample] = []
        for counter, labels in self._counters if self.supported else ():
            try:
                kilobytes = self._call(self._handle, counter)  # type: ignore[misc]
            except self._missing as exc:
                self.supported = False
                log.info(
                    "GPU %d: PCIe throughput not read: %s",
                    self._gpu,
                    exc,
                    extra=log_fields(gpu=self._gpu),
                )
                return []
            except self._nvml.NVMLError as exc:  # a lost GPU too: the cycle's reads say so
                log.debug("GPU %d: PCIe throughput: %s", self._gpu, exc)
                return []
            out.append(Sample(m.PCIE_THROUGHPUT, labels, float(kilobytes) * KB))
        return out
