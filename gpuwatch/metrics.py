"""The catalogue of gpuwatch's metric names: type and help text for each, defined once here."""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

MetricType = Literal["gauge", "counter", "untyped"]


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    type: MetricType
    help: str


UP = "gpuwatch_up"
BUILD_INFO = "gpuwatch_build_info"
GPU_UP = "gpuwatch_gpu_up"
GPU_INFO = "gpuwatch_gpu_info"
TEMPERATURE = "gpuwatch_gpu_temperature_celsius"
MEMORY_TEMPERATURE = "gpuwatch_gpu_memory_temperature_celsius"
MAX_OPERATING_TEMPERATURE = "gpuwatch_gpu_max_operating_temperature_celsius"
SLOWDOWN_TEMPERATURE = "gpuwatch_gpu_slowdown_temperature_celsius"
SHUTDOWN_TEMPERATURE = "gpuwatch_gpu_shutdown_temperature_celsius"
MEMORY_MAX_TEMPERATURE = "gpuwatch_gpu_memory_max_operating_temperature_celsius"
POWER = "gpuwatch_gpu_power_watts"
POWER_LIMIT = "gpuwatch_gpu_power_limit_watts"
ENERGY = "gpuwatch_gpu_energy_joules_total"
UTILIZATION = "gpuwatch_gpu_utilization_ratio"
MEMORY_BANDWIDTH_UTILIZATION = "gpuwatch_gpu_memory_bandwidth_utilization_ratio"
MEMORY_USED = "gpuwatch_gpu_memory_used_bytes"
MEMORY_TOTAL = "gpuwatch_gpu_memory_total_bytes"
SM_CLOCK = "gpuwatch_gpu_sm_clock_hertz"
MEMORY_CLOCK = "gpuwatch_gpu_memory_clock_hertz"
CLOCK_EVENT = "gpuwatch_gpu_clock_event_active"
ECC_ERRORS = "gpuwatch_gpu_ecc_errors_total"
RETIRED_PAGES = "gpuwatch_gpu_retired_pages"
RETIRED_PAGES_PENDING = "gpuwatch_gpu_retired_pages_pending"
REMAPPED_ROWS = "gpuwatch_gpu_remapped_rows"
ROW_REMAP_PENDING = "gpuwatch_gpu_row_remap_pending"
ROW_REMAP_FAILED = "gpuwatch_gpu_row_remap_failed"
XID_ERRORS = "gpuwatch_gpu_xid_errors_total"
PCIE_REPLAYS = "gpuwatch_gpu_pcie_replays_total"
PCIE_LINK_GENERATION = "gpuwatch_gpu_pcie_link_generation"
PCIE_LINK_WIDTH = "gpuwatch_gpu_pcie_link_width"
PCIE_BYTES = "gpuwatch_gpu_pcie_bytes_total"
PCIE_THROUGHPUT = "gpuwatch_gpu_pcie_throughput_bytes_per_second"
PCIE_MAX_GENERATION = "gpuwatch_gpu_pcie_link_max_generation"
PCIE_MAX_WIDTH = "gpuwatch_gpu_pcie_link_max_width"
NVLINK_BYTES = "gpuwatch_gpu_nvlink_bytes_total"
NVLINK_ERRORS = "gpuwatch_gpu_nvlink_errors_total"
NVLINK_LINK_UP = "gpuwatch_gpu_nvlink_link_up"
NVLINK_SPEED = "gpuwatch_gpu_nvlink_speed_bytes_per_second"
RECOVERY_ACTION = "gpuwatch_gpu_recovery_action"
GPU_HEALTH = "gpuwatch_gpu_health"
NODE_HEALTH = "gpuwatch_node_health"
GPU_LIFE_FAULTS = "gpuwatch_gpu_life_faults_total"
SAMPLE_DURATION = "gpuwatch_sample_duration_seconds"
LAST_SAMPLE_TIMESTAMP = "gpuwatch_last_sample_timestamp_seconds"
SAMPLES = "gpuwatch_samples_total"
SAMPLING_OVERRUNS = "gpuwatch_sampling_overruns_total"
NVML_TIMEOUTS = "gpuwatch_nvml_timeouts_total"
NVML_CPU_WAIT_GRANTED = "gpuwatch_nvml_cpu_wait_granted_seconds_total"
NVML_ABANDONED_WORKERS = "gpuwatch_nvml_abandoned_workers"
STORE_SERIES = "gpuwatch_store_series"
GPU_LOST = "gpuwatch_gpu_lost"
GPU_MISSING = "gpuwatch_gpu_missing"
ALERTS = "gpuwatch_alerts"
RULE_EVALUATION_DURATION = "gpuwatch_rule_evaluation_duration_seconds"
RULE_EVALUATION_FAILURES = "gpuwatch_rule_evaluation_failures_total"
RULES_LAST_RELOAD_SUCCESSFUL = "gpuwatch_rules_last_reload_successful"
GPU_PROCESSES = "gpuwatch_gpu_processes"
PROCESS_GPU_MEMORY = "gpuwatch_process_gpu_memory_bytes"
GPU_JOB = "gpuwatch_gpu_job_info"
INSTANCE_MEMORY_USED = "gpuwatch_gpu_instance_memory_used_bytes"
INSTANCE_MEMORY_TOTAL = "gpuwatch_gpu_instance_memory_total_bytes"
INSTANCE_PROCESSES = "gpuwatch_gpu_instance_processes"
NOTIFICATIONS = "gpuwatch_notifications_total"
OUTBOX_PENDING = "gpuwatch_outbox_pending"
NOTIFICATIONS_UNRENDERED = "gpuwatch_notifications_unrendered_total"
NOTIFICATIONS_HELD = "gpuwatch_notifications_held_total"
STATE_WRITE_FAILURES = "gpuwatch_state_write_failures_total"
KMSG_UP = "gpuwatch_kmsg_up"
KMSG_DRIVER_LINES = "gpuwatch_kmsg_driver_lines_total"
KMSG_SUPPRESSED = "gpuwatch_kmsg_lines_suppressed_total"
KMSG_OVERWRITTEN = "gpuwatch_kmsg_overwritten_total"
KMSG_NOT_KERNEL = "gpuwatch_kmsg_not_kernel_lines_total"
NVSWITCH_SXID_ERRORS = "gpuwatch_nvswitch_sxid_errors_total"
NVSWITCH_SXID_LAST = "gpuwatch_nvswitch_sxid_last_timestamp_seconds"
IB_PORT_INFO = "gpuwatch_ib_port_info"
IB_PORT_STATE = "gpuwatch_ib_port_state"
IB_PORT_PHYSICAL_STATE = "gpuwatch_ib_port_physical_state"
IB_PORT_UP = "gpuwatch_ib_port_up"
IB_PORT_RATE = "gpuwatch_ib_port_rate_bytes_per_second"
IB_PORT_ERRORS = "gpuwatch_ib_port_errors_total"
IB_PORT_DATA = "gpuwatch_ib_port_data_bytes_total"
PCI_GPUS = "gpuwatch_pci_gpus"
PCI_GPU_UNLISTED = "gpuwatch_pci_gpu_unlisted"
PCI_DEVICE_UP = "gpuwatch_pci_device_up"
PCIE_AER_ERRORS = "gpuwatch_pcie_aer_errors_total"
SYSFS_READS_LATE = "gpuwatch_sysfs_reads_late_total"
FABRIC_STATE = "gpuwatch_gpu_fabric_state"
FABRIC_STATUS = "gpuwatch_gpu_fabric_status"
FABRIC_CONDITION = "gpuwatch_gpu_fabric_condition"
FABRIC_HEALTH = "gpuwatch_gpu_fabric_health"
FABRIC_MANAGER_UP = "gpuwatch_fabric_manager_up"
PREEMPTION_SECONDS_LEFT = "gpuwatch_node_preemption_seconds_left"
CLOUD_METADATA_UP = "gpuwatch_cloud_metadata_up"
ACTION_NODE_DRAINED = "gpuwatch_action_node_drained"
ACTIONS_HELD = "gpuwatch_actions_held"
ACTION_FAILURES = "gpuwatch_action_failures_total"

_DEFS = [
    MetricDef(UP, "gauge", "1 when the GPU backend (NVML) is loaded and answering."),
    MetricDef(GPU_UP, "gauge", "1 when the GPU answers; 0 when it is lost or unresponsive."),
    MetricDef(GPU_INFO, "gauge", "Descriptive labels of each GPU; always 1."),
    MetricDef(TEMPERATURE, "gauge", "GPU die temperature."),
    MetricDef(MEMORY_TEMPERATURE, "gauge", "GPU memory (HBM) temperature."),
    MetricDef(MAX_OPERATING_TEMPERATURE, "gauge", "The GPU's software thermal capping point."),
    MetricDef(SLOWDOWN_TEMPERATURE, "gauge", "The GPU's hardware thermal slowdown point."),
    MetricDef(SHUTDOWN_TEMPERATURE, "gauge", "The GPU's thermal shutdown point."),
    MetricDef(MEMORY_MAX_TEMPERATURE, "gauge", "The GPU memory's maximum operating temperature."),
    MetricDef(POWER, "gauge", "Power draw of the board."),
    MetricDef(POWER_LIMIT, "gauge", "Enforced power limit."),
    MetricDef(ENERGY, "counter", "Energy consumed since the driver was loaded."),
    MetricDef(UTILIZATION, "gauge", "Fraction of time a kernel was running on the GPU."),
    MetricDef(
        MEMORY_BANDWIDTH_UTILIZATION, "gauge", "Fraction of time device memory was read or written."
    ),
    MetricDef(MEMORY_USED, "gauge", "Device memory in use."),
    MetricDef(MEMORY_TOTAL, "gauge", "Device memory installed."),
    MetricDef(SM_CLOCK, "gauge", "Current SM clock."),
    MetricDef(MEMORY_CLOCK, "gauge", "Current memory clock."),
    MetricDef(CLOCK_EVENT, "gauge", "1 while the named reason holds the clocks down."),
    MetricDef(ECC_ERRORS, "counter", "ECC errors by type and scope."),
    MetricDef(RETIRED_PAGES, "gauge", "Memory pages retired, by cause."),
    MetricDef(RETIRED_PAGES_PENDING, "gauge", "1 when a page retirement waits for a GPU reset."),
    MetricDef(REMAPPED_ROWS, "gauge", "Memory rows remapped, by error type."),
    MetricDef(ROW_REMAP_PENDING, "gauge", "1 when a row remap waits for a GPU reset."),
    MetricDef(ROW_REMAP_FAILED, "gauge", "1 when a row remap failed (the GPU needs service)."),
    MetricDef(XID_ERRORS, "counter", "XID events by code; one increment per event."),
    MetricDef(PCIE_REPLAYS, "counter", "PCIe replay counter."),
    MetricDef(PCIE_LINK_GENERATION, "gauge", "Current PCIe link generation."),
    MetricDef(PCIE_LINK_WIDTH, "gauge", "Current PCIe link width in lanes."),
    MetricDef(PCIE_BYTES, "counter", "PCIe bytes the GPU sent and received, by direction."),
    MetricDef(
        PCIE_THROUGHPUT,
        "gauge",
        "PCIe bytes/s the GPU sent and received, by direction: NVML's 20 ms window or DCGM's.",
    ),
    MetricDef(PCIE_MAX_GENERATION, "gauge", "Highest PCIe generation the GPU and slot support."),
    MetricDef(PCIE_MAX_WIDTH, "gauge", "Widest PCIe link the GPU and slot support, in lanes."),
    MetricDef(NVLINK_BYTES, "counter", "NVLink data bytes per link and direction."),
    MetricDef(NVLINK_ERRORS, "counter", "NVLink errors per link and type."),
    MetricDef(NVLINK_LINK_UP, "gauge", "1 when the NVLink link is active."),
    MetricDef(
        NVLINK_SPEED, "gauge", "Line rate of each active NVLink link, one direction, bytes/s."
    ),
    MetricDef(RECOVERY_ACTION, "gauge", "1 for the recovery action the driver asks for."),
    MetricDef(GPU_HEALTH, "gauge", "1 for the GPU's current health state."),
    MetricDef(NODE_HEALTH, "gauge", "1 for the node's current health state."),
    MetricDef(GPU_LIFE_FAULTS, "counter", "Faults in the GPU's life record on this node."),
    MetricDef(SAMPLE_DURATION, "gauge", "Duration of the last sampling cycle."),
    MetricDef(LAST_SAMPLE_TIMESTAMP, "gauge", "When the last sampling cycle ended."),
    MetricDef(SAMPLES, "counter", "Sampling cycles completed."),
    MetricDef(SAMPLING_OVERRUNS, "counter", "Sampling ticks skipped because a cycle ran too long."),
    MetricDef(NVML_TIMEOUTS, "counter", "NVML calls abandoned past their deadline."),
    MetricDef(
        NVML_CPU_WAIT_GRANTED, "counter", "Time NVML deadlines grew: the daemon waited for a CPU."
    ),
    MetricDef(
        NVML_ABANDONED_WORKERS, "gauge", "Worker threads still stuck in an abandoned NVML call."
    ),
    MetricDef(STORE_SERIES, "gauge", "Series held in the in-memory store."),
    MetricDef(BUILD_INFO, "gauge", "1; the versions of gpuwatch, Python and nvidia-ml-py."),
    MetricDef(GPU_LOST, "gauge", "1 when NVML reports the GPU lost (fallen off the bus)."),
    MetricDef(
        GPU_MISSING,
        "gauge",
        "1 per GPU this node had (state directory) that the driver no longer lists.",
    ),
    MetricDef(ALERTS, "gauge", "1 per pending or firing alert (Prometheus's ALERTS, renamed)."),
    MetricDef(RULE_EVALUATION_DURATION, "gauge", "Duration of the last evaluation of a group."),
    MetricDef(RULE_EVALUATION_FAILURES, "counter", "Rule evaluations that failed, per group."),
    MetricDef(
        RULES_LAST_RELOAD_SUCCESSFUL, "gauge", "1 when the last load of the rule files worked."
    ),
    MetricDef(GPU_PROCESSES, "gauge", "Compute processes running on the GPU."),
    MetricDef(GPU_JOB, "gauge", "A job (scheduler, job_id) running on the GPU; always 1."),
    MetricDef(INSTANCE_MEMORY_USED, "gauge", "Memory in use in a MIG GPU instance."),
    MetricDef(INSTANCE_MEMORY_TOTAL, "gauge", "Memory of a MIG GPU instance."),
    MetricDef(INSTANCE_PROCESSES, "gauge", "Compute processes running in a MIG GPU instance."),
    MetricDef(
        PROCESS_GPU_MEMORY,
        "gauge",
        "GPU memory of each compute process (opt-in: sampling.process_memory_metrics).",
    ),
    MetricDef(
        NOTIFICATIONS,
        "counter",
        "Notification attempts per receiver and outcome (sent, failed, throttled, rejected).",
    ),
    MetricDef(OUTBOX_PENDING, "gauge", "Notifications in the outbox, not yet delivered."),
    MetricDef(
        NOTIFICATIONS_UNRENDERED,
        "counter",
        "Notifications a receiver's format could not render in full; sent as plain text.",
    ),
    MetricDef(
        NOTIFICATIONS_HELD,
        "counter",
        "Times a notification of a job's alerts was due and waited for the receiver's hourly "
        "budget (notify.job_notifications_per_hour).",
    ),
    MetricDef(
        STATE_WRITE_FAILURES,
        "counter",
        "Writes to a state file (journal.db, notify.db) that failed, e.g. on a full disk.",
    ),
    MetricDef(KMSG_UP, "gauge", "1 while the kernel log (sources.kmsg.path) is being read."),
    MetricDef(
        KMSG_DRIVER_LINES,
        "counter",
        "Kernel log lines of the NVIDIA drivers read, by kind (xid, sxid, fallen_off_bus, ...).",
    ),
    MetricDef(
        KMSG_NOT_KERNEL,
        "counter",
        "Kernel log records the kernel did not write (a program's syslog tag, a user-space "
        "facility), read as noise whatever they say.",
    ),
    MetricDef(
        KMSG_SUPPRESSED,
        "counter",
        "Other NVIDIA driver lines not journaled, past the limit of 30 a minute.",
    ),
    MetricDef(
        KMSG_OVERWRITTEN,
        "counter",
        "Times the kernel's log buffer overwrote records before gpuwatch read them.",
    ),
    MetricDef(
        NVSWITCH_SXID_ERRORS,
        "counter",
        "SXid errors an NVSwitch reported in the kernel log, by code and severity; this boot.",
    ),
    MetricDef(
        NVSWITCH_SXID_LAST,
        "gauge",
        "When an NVSwitch last reported the SXid in the kernel log (Unix time); this boot.",
    ),
    MetricDef(
        IB_PORT_INFO,
        "gauge",
        "1 per InfiniBand/RoCE port: its link layer, its NIC's PCI address, the GPUs near it.",
    ),
    MetricDef(IB_PORT_STATE, "gauge", "Logical port state: 1 down, 2 init, 3 armed, 4 active."),
    MetricDef(
        IB_PORT_PHYSICAL_STATE,
        "gauge",
        "Physical port state: 2 polling, 3 disabled, 4 training, 5 link up, 6 error recovery.",
    ),
    MetricDef(IB_PORT_UP, "gauge", "1 when the port is active with its physical link up."),
    MetricDef(IB_PORT_RATE, "gauge", "The port's signalling rate."),
    MetricDef(
        IB_PORT_ERRORS,
        "counter",
        "The port's error counters by sysfs name (they stop at 15, 255 or 65535 until cleared).",
    ),
    MetricDef(IB_PORT_DATA, "counter", "Data through the port, by direction."),
    MetricDef(PCI_GPUS, "gauge", "NVIDIA GPUs on the PCI bus that answer config reads."),
    MetricDef(
        PCI_GPU_UNLISTED,
        "gauge",
        "1 for a GPU on the PCI bus the driver does not list (it lists fewer than the bus has).",
    ),
    MetricDef(
        PCI_DEVICE_UP,
        "gauge",
        "1 while an NVIDIA GPU or NVSwitch seen on the bus is there; 0 once the bus lost it.",
    ),
    MetricDef(PCIE_AER_ERRORS, "counter", "PCIe AER errors the device reported, by severity."),
    MetricDef(
        SYSFS_READS_LATE,
        "counter",
        "Cycles whose sysfs read missed its deadline or found the last one still blocked.",
    ),
    MetricDef(
        FABRIC_STATE,
        "gauge",
        "1 for the GPU's NVLink fabric registration state (not_started, in_progress, completed).",
    ),
    MetricDef(
        FABRIC_STATUS,
        "gauge",
        "NVML's return code for the GPU's completed fabric registration: 0 is success.",
    ),
    MetricDef(
        FABRIC_CONDITION,
        "gauge",
        "1 while the driver reports the fabric condition for the GPU (degraded_bandwidth, ...).",
    ),
    MetricDef(
        FABRIC_HEALTH,
        "gauge",
        "1 for the driver's summary of the GPU's fabric health (healthy, unhealthy, ...).",
    ),
    MetricDef(
        FABRIC_MANAGER_UP,
        "gauge",
        "1 while Fabric Manager accepts connections on its command port (NVSwitch nodes).",
    ),
    MetricDef(
        PREEMPTION_SECONDS_LEFT,
        "gauge",
        "Seconds until the cloud takes the VM away, while its metadata service gives notice.",
    ),
    MetricDef(
        CLOUD_METADATA_UP,
        "gauge",
        "1 while the cloud's metadata service answers as its provider documents it.",
    ),
    MetricDef(
        ACTION_NODE_DRAINED,
        "gauge",
        "1 while gpuwatch holds the node drained in the scheduler (in a dry run: would).",
    ),
    MetricDef(ACTIONS_HELD, "gauge", "1 while the circuit breaker holds a drain back."),
    MetricDef(ACTION_FAILURES, "counter", "Scheduler commands (scontrol, sinfo) that failed."),
]

CATALOGUE: dict[str, MetricDef] = {d.name: d for d in _DEFS}

PUSHED_HELP = "Pushed by a job (gpuwatch.client, /api/v1/push or a textfile): its last value."
# Samples of a histogram or a summary (and a counter's creation time): their family's TYPE
# belongs to the base name, which a job's push does not carry whole, so they go untyped.
_FAMILY_PARTS = ("_bucket", "_sum", "_count", "_created")


def pushed(name: str, exists: Callable[[str], bool] = lambda _: False) -> MetricDef:
    """What /metrics says of a metric a job pushed (its name is the job's), typed by
    Prometheus's naming rules so that `promtool check metrics` passes whatever a job sends:
    a `_total` is a counter, a histogram's or summary's part untyped, anything else a gauge
    (the last value pushed). rate() and increase() work on each as before. A counter's
    family is its name less `_total`, with `<family>_created` inside it: where either is a
    series of its own on the page (`exists`), or nothing is left of the name, the `_total`
    goes untyped, or OpenMetrics would show one family twice."""
    if name.endswith("_total"):
        family = name.removesuffix("_total")
        alone = bool(family) and not exists(family) and not exists(f"{family}_created")
        return MetricDef(name, "counter" if alone else "untyped", PUSHED_HELP)
    if name.endswith(_FAMILY_PARTS):
        return MetricDef(name, "untyped", PUSHED_HELP)
    return MetricDef(name, "gauge", PUSHED_HELP)


@cache
def build_labels() -> tuple[tuple[str, str], ...]:
    """What runs here, for gpuwatch_build_info: which fleet nodes run which release, and
    with which nvidia-ml-py (what NVML calls it knows)."""
    from gpuwatch import __version__

    return (
        ("version", __version__),
        ("python_version", platform.python_version()),
        ("nvidia_ml_py_version", installed_version("nvidia_ml_py") or "none"),
    )


def installed_version(distribution: str) -> str | None:
    """The Version of the installed distribution of that (normalized, underscored) name, from
    its metadata on sys.path, as importlib.metadata finds it; read here because importing
    importlib.metadata (with the email and zipfile packages) costs the daemon 3.3 MiB."""
    for entry in sys.path:
        folder = Path(entry or ".")
        try:
            found = [
                *folder.glob(f"{distribution}-*.dist-info/METADATA"),
                *folder.glob(f"{distribution}-*.egg-info/PKG-INFO"),
                *(p for p in folder.glob(f"{distribution}-*.egg-info") if p.is_file()),
            ]
        except OSError:
            continue
        for metadata in found:
            try:
                text = metadata.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            for line in text.split("\n\n", 1)[0].splitlines():
                if line.lower().startswith("version:"):
                    return line.partition(":")[2].strip()
    return None
