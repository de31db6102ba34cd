"""The GPUs this node has had, in `gpus.json` in the state directory, so a GPU that vanished
while the daemon was down (fell off the bus, then a reboot that did not bring it back) is still
reported: NVML simply stops listing it, with no XID and no error."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gpuwatch import metrics as m
from gpuwatch.model import GpuInfo, MissingGpu, Sample
from gpuwatch.state.atomicfile import read_json_records, write_json

log = logging.getLogger(__name__)

FILE_NAME = "gpus.json"


def _gpu_from_json(item: Any) -> MissingGpu:
    return MissingGpu(
        str(item["uuid"]),
        int(item["index"]),
        str(item["model"]),
        str(item["serial"]),
        str(item["pci_bus_id"]),
    )


class Inventory:
    def __init__(self, state_dir: Path | None) -> None:
        self.path = state_dir / FILE_NAME if state_dir is not None else None
        self.known: dict[str, MissingGpu] = {}
        if self.path is not None:
            for gpu in read_json_records(self.path, "GPU inventory", _gpu_from_json):
                self.known[gpu.uuid] = gpu

    def update(self, present: list[GpuInfo]) -> tuple[MissingGpu, ...]:
        """Record the GPUs present now; return the known ones that are not. A known GPU whose
        PCI slot another GPU now holds was replaced (an RMA): it is forgotten, not missing."""
        seen = {g.uuid for g in present}
        slots = {g.pci_bus_id for g in present if g.pci_bus_id}
        before = dict(self.known)
        for uuid, gone in before.items():
            if uuid not in seen and gone.pci_bus_id in slots:
                log.info(
                    "GPU %s (last seen as GPU %d) was replaced: another GPU is in its slot %s",
                    uuid,
                    gone.index,
                    gone.pci_bus_id,
                )
                del self.known[uuid]
        missing = tuple(g for uuid, g in self.known.items() if uuid not in seen)
        for g in present:
            self.known[g.uuid] = MissingGpu(g.uuid, g.index, g.model, g.serial, g.pci_bus_id)
        if self.known != before and self.path is not None:
            try:
                write_json(self.path, [_as_json(g) for g in self.known.values()])
            except OSError as exc:
                log.error("GPU inventory %s: cannot write: %s", self.path, exc)
        return missing


def _as_json(gpu: MissingGpu) -> dict[str, str | int]:
    return {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "model": gpu.model,
        "serial": gpu.serial,
        "pci_bus_id": gpu.pci_bus_id,
    }


def missing_samples(missing: tuple[MissingGpu, ...]) -> list[Sample]:
    """gpuwatch_gpu_missing for each GPU the driver no longer lists, by its last index. It
    carries the GPU's descriptive labels itself: there is no gpuwatch_gpu_info to join."""
    out = []
    for g in missing:
        labels = (("gpu", str(g.index)), ("uuid", g.uuid), ("model", g.model),
                  ("pci_bus_id", g.pci_bus_id), ("serial", g.serial))  # fmt: skip
        out.append(Sample(m.GPU_MISSING, labels, 1.0))
    return out
