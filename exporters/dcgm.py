"""dcgm-exporter's /metrics, read as gpuwatch's: names, units and labels mapped.

dcgm-exporter prints one series per DCGM field per GPU (per GPU instance under MIG), labelled
`gpu`, `UUID` (`uuid` in its 1.x namespace), `pci_bus_id`, `device`, `modelName`, `Hostname`
(`hostname` since 4.5), static fields as labels (`DCGM_FI_DRIVER_VERSION`), `GPU_I_PROFILE` and
`GPU_I_ID` under MIG, and `pod`, `namespace`, `container` with Kubernetes pod mapping on.

- Fields gpuwatch has a name for become gpuwatch's series, in base units (MHz -> Hz, mJ -> J,
  MiB -> bytes, % -> ratio), under either DCGM name: DCGM 4.6 renamed many fields, some to new
  field ids in base units (DCGM_FI_DEV_SM_CLOCK_HERTZ), some to a new name for the same field
  (DCGM_FI_DEV_GPU_UTIL_RATIO is field 203, DCGM_FI_DEV_GPU_UTIL, still in percent).
- The others pass through under their DCGM names with their labels, so existing DCGM rules and
  dashboards keep working; `modelName` and the static-field labels are left off (they are on
  gpuwatch_gpu_info, and promtool rejects camelCase label names).
- DCGM's blank and "not supported" sentinels are absent, never a value. So is a memory
  temperature of 0 °C: DCGM reports 0 where the GPU has no memory sensor (L4, vGPU).
- Under MIG, every GPU instance repeats the GPU's own fields; the framebuffer fields are the
  instance's own, and are summed into the GPU's.
- dcgm-exporter's XID field is the last XID's code, not a count: the source turns changes of it
  into XID events (see gpuwatch.exporters.dcgm_source).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatch import metrics as m
from gpuwatch.model import GpuInfo, GpuProcess, Labels, Sample
from gpuwatch.nvml.fields import CLOCK_EVENT_REASONS, RECOVERY_ACTIONS

MIB = float(2**20)

# DCGM's sentinels (dcgm_structs.h): blank, not found, not supported, not permissioned.
_INT32_BLANK = 2147483632
_FP64_BLANK = 140737488355328.0
_INT64_BLANK_FLOOR = 9.2233720368547e18  # 0x7ffffffffffffff0 and up, as a float


def is_blank(value: float) -> bool:
    return (
        _INT32_BLANK <= value <= _INT32_BLANK + 3
        or _FP64_BLANK <= value <= _FP64_BLANK + 3
        or value >= _INT64_BLANK_FLOOR
    )


@dataclass(frozen=True, slots=True)
class Field:
    """How one DCGM field becomes a gpuwatch series."""

    metric: str
    scale: float = 1.0
    labels: Labels = ()


def _both(old: str, new: str, f: Field) -> dict[str, Field]:
    return {old: f, new: f}


_ECC = "DCGM_FI_DEV_ECC_"
_VOLATILE, _AGGREGATE = ("scope", "volatile"), ("scope", "aggregate")
FIELDS: dict[str, Field] = {
    **_both("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_TEMP_CELSIUS", Field(m.TEMPERATURE)),
    **_both(
        "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", Field(m.MEMORY_TEMPERATURE)
    ),
    # Thresholds: what nvmlDeviceGetTemperatureThreshold answers, as DCGM reads them.
    **_both(
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        "DCGM_FI_DEV_GPU_TEMP_SLOWDOWN_CELSIUS",
        Field(m.SLOWDOWN_TEMPERATURE),
    ),
    **_both(
        "DCGM_FI_DEV_SHUTDOWN_TEMP",
        "DCGM_FI_DEV_GPU_TEMP_SHUTDOWN_CELSIUS",
        Field(m.SHUTDOWN_TEMPERATURE),
    ),
    "DCGM_FI_DEV_GPU_MAX_OP_TEMP": Field(m.MAX_OPERATING_TEMPERATURE),
    **_both(
        "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
        "DCGM_FI_DEV_MEMORY_MAX_OP_TEMP_CELSIUS",
        Field(m.MEMORY_MAX_TEMPERATURE),
    ),
    **_both("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS", Field(m.POWER)),
    **_both(
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
        Field(m.POWER_LIMIT),
    ),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": Field(m.ENERGY, 0.001),  # mJ
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": Field(m.ENERGY),
    # Field 203 under both names: a percentage, whatever the new name says.
    **_both("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", Field(m.UTILIZATION, 0.01)),
    "DCGM_FI_DEV_MEM_COPY_UTIL": Field(m.MEMORY_BANDWIDTH_UTILIZATION, 0.01),
    "DCGM_FI_DEV_FB_USED": Field(m.MEMORY_USED, MIB),
    "DCGM_FI_DEV_FB_TOTAL": Field(m.MEMORY_TOTAL, MIB),
    "DCGM_FI_DEV_SM_CLOCK": Field(m.SM_CLOCK, 1e6),  # MHz
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": Field(m.SM_CLOCK),
    "DCGM_FI_DEV_MEM_CLOCK": Field(m.MEMORY_CLOCK, 1e6),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": Field(m.MEMORY_CLOCK),
    f"{_ECC}SBE_VOL_TOTAL": Field(m.ECC_ERRORS, labels=(("type", "corrected"), _VOLATILE)),
    f"{_ECC}DBE_VOL_TOTAL": Field(m.ECC_ERRORS, labels=(("type", "uncorrected"), _VOLATILE)),
    f"{_ECC}SBE_AGG_TOTAL": Field(m.ECC_ERRORS, labels=(("type", "corrected"), _AGGREGATE)),
    f"{_ECC}DBE_AGG_TOTAL": Field(m.ECC_ERRORS, labels=(("type", "uncorrected"), _AGGREGATE)),
    **_both(
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_PAGE_RETIRED_SBE_TOTAL",
        Field(m.RETIRED_PAGES, labels=(("cause", "sbe"),)),
    ),
    **_both(
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_PAGE_RETIRED_DBE_TOTAL",
        Field(m.RETIRED_PAGES, labels=(("cause", "dbe"),)),
    ),
    **_both(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
        Field(m.REMAPPED_ROWS, labels=(("type", "uncorrectable"),)),
    ),
    **_both(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
        Field(m.REMAPPED_ROWS, labels=(("type", "correctable"),)),
    ),
    **_both(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ROW_REMAP_FAILED", Field(m.ROW_REMAP_FAILED)
    ),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": Field(m.ROW_REMAP_PENDING),
    **_both(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", Field(m.PCIE_REPLAYS)
    ),
    "DCGM_FI_DEV_PCIE_LINK_GEN": Field(m.PCIE_LINK_GENERATION),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": Field(m.PCIE_LINK_WIDTH),
}
# PCIe profiling gauges, bytes/s over DCGM's own interval (protocol headers included): the
# series NVML's 20 ms throughput windows give, a steadier reading of it. Also passed through,
# for dashboards on DCGM's names; under MIG each instance's own, none of them the GPU's.
PCIE_PROFILING = {"DCGM_FI_PROF_PCIE_TX_BYTES": "tx", "DCGM_FI_PROF_PCIE_RX_BYTES": "rx"}
# NVLink error counters, all links together (link="all") or one link each (per-link names
# _COUNT_L<n> before DCGM 4.6, _L<n>_TOTAL after).
_NVLINK_ERRORS = {
    "CRC_FLIT": "crc_flit",
    "CRC_DATA": "crc_data",
    "REPLAY": "replay",
    "RECOVERY": "recovery",
}
for _dcgm, _type in _NVLINK_ERRORS.items():
    _f = Field(m.NVLINK_ERRORS, labels=(("link", "all"), ("type", _type)))
    FIELDS[f"DCGM_FI_DEV_NVLINK_{_dcgm}_ERROR_COUNT_TOTAL"] = _f
    FIELDS[f"DCGM_FI_DEV_NVLINK_{_dcgm}_ERROR_TOTAL"] = _f
    for _link in range(18):
        _fl = Field(m.NVLINK_ERRORS, labels=(("link", str(_link)), ("type", _type)))
        FIELDS[f"DCGM_FI_DEV_NVLINK_{_dcgm}_ERROR_COUNT_L{_link}"] = _fl
        FIELDS[f"DCGM_FI_DEV_NVLINK_{_dcgm}_ERROR_L{_link}_TOTAL"] = _fl

XID_FIELDS = frozenset({"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"})
CLOCK_EVENT_FIELDS = frozenset(
    {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"}
)
RECOVERY_FIELDS = frozenset(
    {"DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION", "DCGM_FI_DEV_GPU_RECOVERY_ACTION"}
)
RETIRED_PENDING_FIELDS = frozenset(
    {"DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_PAGE_RETIRED_PENDING"}
)
FB_FREE, FB_RESERVED = "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
# Each MIG instance's own framebuffer: summed over a GPU's instances (the others repeat the GPU).
MIG_SUMMED = frozenset({"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL", FB_FREE, FB_RESERVED})

# Labels that identify a GPU, the host, the pod or the MIG instance: what a pass-through series
# keeps. The rest (modelName, static fields printed as labels) is on gpuwatch_gpu_info.
_PASSED_LABELS = frozenset(
    {"gpu", "UUID", "uuid", "pci_bus_id", "device", "Hostname", "hostname", "GPU_I_PROFILE",
     "GPU_I_ID", "pod", "namespace", "container", "pod_uid", "err_code", "err_msg", "nvlink",
     "nvswitch", "gpu_uuid", "DCGM_FI_PROCESS_NAME"}
)  # fmt: skip


@dataclass
class DcgmGpu:
    info: GpuInfo
    driver_version: str = ""
    xid: int | None = None  # the last XID dcgm-exporter shows; None when it has no XID field
    pods: set[tuple[str, str, str]] = field(default_factory=set)  # namespace, pod, container

    @property
    def processes(self) -> tuple[GpuProcess, ...]:
        """The pods on it, as jobs (dcgm-exporter names pods, not processes: pid 0)."""
        return tuple(
            GpuProcess(0, container or pod, namespace, None, "kubernetes", pod)
            for namespace, pod, container in sorted(self.pods)
        )


@dataclass
class DcgmReading:
    """One scrape of dcgm-exporter, in gpuwatch's terms."""

    gpus: dict[str, DcgmGpu]  # by UUID
    samples: list[Sample]  # gpuwatch's series (gpu_up and gpu_info included) and pass-through


class DcgmFormatError(ValueError):
    """The text is not Prometheus exposition format."""


def _dcgm_name(name: str, kind: str) -> str:
    """The name as dcgm-exporter printed it: prometheus_client's parser adds `_total` to the
    samples of a counter whose name lacks it, and DCGM's names (upper case) never end in it."""
    if kind == "counter" and name.endswith("_total") and not any(c.islower() for c in name[:-6]):
        return name[:-6]
    return name


def _uuid(labels: dict[str, str]) -> str:
    return labels.get("UUID") or labels.get("uuid") or labels.get("gpu_uuid", "")


def read_dcgm(text: str) -> DcgmReading:
    """Map one dcgm-exporter /metrics text. Raises DcgmFormatError on what is not the format."""
    # Imported here, not with the module: a daemon on NVML never pays prometheus_client's
    # 4.4 MiB for it.
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise DcgmFormatError(str(exc)) from exc
    gpus: dict[str, DcgmGpu] = {}
    mapped: dict[tuple[str, Labels], float] = {}  # summed over MIG instances where they add up
    seen_instance: set[tuple[str, str, str]] = set()

    def first_from_instance(name: str, uuid: str, labels: dict[str, str]) -> bool:
        """True the first time this field is seen from this GPU instance (or whole GPU):
        pod labels can repeat an instance's series, which must not be summed twice."""
        instance = (name, uuid, labels.get("GPU_I_ID", ""))
        if instance in seen_instance:
            return False
        seen_instance.add(instance)
        return True

    passed: list[Sample] = []
    # MIG: each GPU instance's framebuffer fields, under the labels the NVML source gives it.
    instances: dict[Labels, dict[str, float]] = {}
    fb_free: dict[str, float] = {}
    fb_reserved: dict[str, float] = {}
    recovery: dict[str, float] = {}
    per_link: set[tuple[str, str]] = set()  # (uuid, type) with per-link NVLink counters
    for family in families:
        for sample in family.samples:
            name, labels = _dcgm_name(sample.name, family.type), sample.labels
            value = float(sample.value)
            uuid = _uuid(labels)
            if not uuid or "gpu" not in labels:
                if not is_blank(value):
                    passed.append(Sample(name, _passed(labels), value))
                continue
            gpu = gpus.get(uuid)
            if gpu is None:
                gpu = gpus[uuid] = _new_gpu(uuid, labels)
            if labels.get("pod"):
                gpu.pods.add(
                    (labels.get("namespace", ""), labels["pod"], labels.get("container", ""))
                )
            if is_blank(value):
                continue
            if labels.get("GPU_I_ID") and name in MIG_SUMMED:
                key_labels = (*gpu.info.labels, ("gpu_i_id", labels["GPU_I_ID"]),
                              ("gpu_i_profile", labels.get("GPU_I_PROFILE", "")))  # fmt: skip
                instances.setdefault(key_labels, {}).setdefault(name, value * MIB)
            if name in XID_FIELDS:  # also passed through: DCGM rules on it keep working
                gpu.xid = int(value)
                passed.append(Sample(name, _passed(labels), value))
                continue
            base = gpu.info.labels
            if name in CLOCK_EVENT_FIELDS:
                for bit, reason in CLOCK_EVENT_REASONS:
                    key = (m.CLOCK_EVENT, (*base, ("reason", reason)))
                    mapped[key] = 1.0 if int(value) & bit else 0.0
            elif name in RECOVERY_FIELDS:
                recovery[uuid] = value
            elif name in PCIE_PROFILING:
                if not labels.get("GPU_I_ID"):
                    direction = (("direction", PCIE_PROFILING[name]),)
                    mapped.setdefault((m.PCIE_THROUGHPUT, (*base, *direction)), value)
                passed.append(Sample(name, _passed(labels), value))
            elif name in RETIRED_PENDING_FIELDS:
                mapped[(m.RETIRED_PAGES_PENDING, base)] = 1.0 if value > 0 else 0.0
            elif name in (FB_FREE, FB_RESERVED):
                target = fb_free if name == FB_FREE else fb_reserved
                if first_from_instance(name, uuid, labels):
                    target[uuid] = target.get(uuid, 0.0) + value
            elif (f := FIELDS.get(name)) is not None:
                if f.metric == m.MEMORY_TEMPERATURE and value == 0.0:
                    continue  # no memory sensor
                key = (f.metric, (*base, *f.labels))
                if f.metric == m.NVLINK_ERRORS and f.labels[0][1] != "all":
                    per_link.add((uuid, f.labels[1][1]))
                if name in MIG_SUMMED:
                    if first_from_instance(name, uuid, labels):
                        mapped[key] = mapped.get(key, 0.0) + value * f.scale
                else:
                    mapped.setdefault(key, value * f.scale)
            else:
                passed.append(Sample(name, _passed(labels), value))
    samples: list[Sample] = []
    for uuid, gpu in gpus.items():
        base = gpu.info.labels
        samples.append(Sample(m.GPU_UP, base, 1.0))
        samples.append(Sample(m.GPU_INFO, _info_labels(gpu), 1.0))
        if (m.MEMORY_TOTAL, base) not in mapped and uuid in fb_free:
            used = mapped.get((m.MEMORY_USED, base))
            if used is not None:
                total = used + (fb_free[uuid] + fb_reserved.get(uuid, 0.0)) * MIB
                mapped[(m.MEMORY_TOTAL, base)] = total
        if uuid in recovery:
            action = int(recovery[uuid])
            for i, state in enumerate(RECOVERY_ACTIONS):
                key = (m.RECOVERY_ACTION, (*base, ("action", state)))
                mapped[key] = 1.0 if action == i else 0.0
    for series, fb in instances.items():
        in_use = fb.get("DCGM_FI_DEV_FB_USED")
        if in_use is None:
            continue
        samples.append(Sample(m.INSTANCE_MEMORY_USED, series, in_use))
        size = fb.get("DCGM_FI_DEV_FB_TOTAL")
        if size is None and FB_FREE in fb:
            size = in_use + fb[FB_FREE] + fb.get(FB_RESERVED, 0.0)
        if size is not None:
            samples.append(Sample(m.INSTANCE_MEMORY_TOTAL, series, size))
    for (name, series), value in mapped.items():
        if name == m.NVLINK_ERRORS and ("link", "all") in series:
            d = dict(series)
            if (d["uuid"], d["type"]) in per_link:
                continue  # the per-link counters say it; the total would count it twice
        samples.append(Sample(name, series, value))
    unique: dict[tuple[str, Labels], Sample] = {}
    for kept in passed:  # a repeat of a name and labels would break the exposition
        unique.setdefault((kept.name, kept.labels), kept)
    samples.extend(unique.values())
    return DcgmReading(gpus, samples)


def _new_gpu(uuid: str, labels: dict[str, str]) -> DcgmGpu:
    info = GpuInfo(
        index=int(labels["gpu"]) if labels["gpu"].isdigit() else -1,
        uuid=uuid,
        model=labels.get("modelName") or labels.get("model_name", ""),
        pci_bus_id=labels.get("pci_bus_id", ""),
        serial=labels.get("DCGM_FI_DEV_SERIAL") or labels.get("DCGM_FI_DEV_BOARD_SERIAL", ""),
        vbios_version=labels.get("DCGM_FI_DEV_VBIOS_VERSION", ""),
        nvlink_count=0,
    )
    driver = labels.get("DCGM_FI_DRIVER_VERSION") or labels.get("DCGM_FI_SYSTEM_DRIVER_VERSION", "")
    return DcgmGpu(info, driver)


def _info_labels(gpu: DcgmGpu) -> Labels:
    info = gpu.info
    return (
        *info.labels,
        ("model", info.model),
        ("pci_bus_id", info.pci_bus_id),
        ("serial", info.serial),
        ("driver_version", gpu.driver_version),
        ("vbios_version", info.vbios_version),
    )


def _passed(labels: dict[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in labels.items() if k in _PASSED_LABELS))
