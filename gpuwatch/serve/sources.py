"""Building what the daemon samples: the GPU source (NVML or dcgm-exporter) and the watchers
beside it (the kernel log)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gpuwatch.clock import Clock
from gpuwatch.cloud.metadata import CloudNotices
from gpuwatch.config import Config
from gpuwatch.exporters.dcgm_source import DcgmSource
from gpuwatch.kernel.gpus import GpuDirectory
from gpuwatch.kernel.line_events import SEQ
from gpuwatch.kernel.sysfs import SysfsWatcher
from gpuwatch.kernel.watcher import KernelLog
from gpuwatch.model import Event
from gpuwatch.nvml.cpu_wait import SchedstatWait
from gpuwatch.nvml.errors import NvmlModule
from gpuwatch.nvml.source import NvmlSource
from gpuwatch.source import Source, Watcher
from gpuwatch.state.inventory import Inventory
from gpuwatch.state.journal import Journal


class NoSourceError(Exception):
    """Neither NVML nor a dcgm-exporter to read the GPUs from."""


def make_source(
    config: Config,
    nvml: NvmlModule | None,
    clock: Clock,
    publish: Callable[[Event], None],
    state_dir: Path,
) -> Source:
    """dcgm-exporter when sources.dcgm.url (or --dcgm) names one, else NVML."""
    inventory = Inventory(state_dir)
    if config.sources.dcgm_url is not None:
        return DcgmSource(
            config.sources.dcgm_url,
            clock,
            config.sampling.deadline,
            publish,
            inventory,
        )
    if nvml is None:
        raise NoSourceError("no GPU source: NVML was not loaded and no dcgm-exporter is set")
    return NvmlSource(nvml, clock, config.sampling, publish, inventory, cpu_wait=SchedstatWait())


KERNEL_LOG_RESTORE_LIMIT = 100_000  # this boot's kernel-log events read back at start, at most


def make_watchers(
    config: Config,
    clock: Clock,
    publish: Callable[[Event], None],
    gpus: GpuDirectory,
    journal: Journal,
) -> list[Watcher]:
    """What the daemon watches beside the GPUs: sysfs (the PCI bus, InfiniBand ports) and the
    kernel log (unless sources.kmsg is off); Fabric Manager's port on a node with NVSwitches;
    the cloud's metadata service where sources.cloud names a provider."""
    sources = config.sources
    watchers: list[Watcher] = [
        SysfsWatcher(
            sources.sysfs_root, clock, gpus, config.sampling.deadline, sources.fabric_manager
        )
    ]
    if config.sources.kmsg_path is not None:
        restored = journal.events_carrying(SEQ, KERNEL_LOG_RESTORE_LIMIT)
        watchers.append(KernelLog(config.sources.kmsg_path, clock, publish, gpus, restored))
    cloud = config.sources.cloud
    if cloud is not None:
        watchers.append(CloudNotices(cloud.provider, cloud.address, cloud.interval, clock, publish))
    return watchers
