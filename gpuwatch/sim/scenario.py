"""Scenario files: a simulated node and a list of timed faults (DESIGN §7)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwatch.sim.cdefs import ERRORS
from gpuwatch.sim.driver import DEFAULT_PROFILE, PROFILES, DriverProfile
from gpuwatch.sim.models import ALIASES, MODELS, GpuModel, find_model
from gpuwatch.units import parse_duration
from gpuwatch.yamlfile import (
    Checker,
    FileError,
    PathKey,
    Problem,
    YamlDoc,
    boolean,
    load,
    one_of,
    parse,
    whole_number,
)

WORKLOADS = ("training", "inference", "idle")
VIRTUALIZATION = ("none", "vgpu_guest")
MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb$")

# Faults the simulated training job shows in its own reports (and, for nccl_hang and
# idle_with_memory, in its GPUs' signals too).
JOB_FAULT_KINDS = ("nan_loss", "step_stall", "nccl_hang", "idle_with_memory")
# Every fault kind of DESIGN §7.
FAULT_KINDS = (
    "xid",
    "nvml_hang",
    "fall_off_bus",
    "thermal_runaway",
    "hw_slowdown",
    "power_brake",
    "ecc_sbe",
    "ecc_dbe",
    "row_remap_pending",
    "row_remap_failure",
    "nvlink_down",
    "nvlink_crc_storm",
    "pcie_replay_storm",
    "recovery_action",
    "retired_pages",
    "nvml_error",
    "event_wait_error",
    *JOB_FAULT_KINDS,
)
ERROR_FAULT_KINDS = ("nvml_error", "event_wait_error")


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    gpu: int
    at: float  # seconds after the scenario starts
    duration: float | None = None  # None: until the end
    code: int | None = None  # XID code, for `xid`
    error: str | None = None  # nvml.h's error name, for nvml_error and event_wait_error
    action: int | None = None  # the driver's recovery action, for recovery_action

    def active(self, elapsed: float) -> bool:
        if elapsed < self.at:
            return False
        return self.duration is None or elapsed < self.at + self.duration


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    gpus: int
    model: GpuModel
    workload: str
    seed: int
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    driver: DriverProfile = PROFILES[DEFAULT_PROFILE]
    mig: dict[int, tuple[str, ...]] = field(default_factory=dict)  # GPU -> instance profiles
    ecc: bool = True  # ECC mode enabled (off: every ECC counter answers NOT_SUPPORTED)
    virtualization: str = "none"  # "vgpu_guest": a VM with a vGPU, as GRID guests see it

    def with_gpus(self, gpus: int) -> Scenario:
        return replace(
            self,
            gpus=gpus,
            faults=tuple(f for f in self.faults if f.gpu < gpus),
            mig={g: p for g, p in self.mig.items() if g < gpus},
        )


def _scenario_dir() -> Path:
    return Path(str(resources.files("gpuwatch.sim") / "scenarios"))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in _scenario_dir().glob("*.yaml"))


def from_doc(doc: YamlDoc, default_name: str) -> Scenario:
    c = Checker(doc)
    top = c.section(doc.data, (), ("name", "description", "node", "faults"))
    node = c.section(
        top.get("node"),
        ("node",),
        ("gpus", "model", "workload", "seed", "driver", "mig", "ecc", "virtualization"),
    )
    gpus = c.value(node, ("node",), "gpus", whole_number(1, 1024), 8)
    seed = c.value(node, ("node",), "seed", whole_number(0, 2**31), 1)
    workload = c.value(node, ("node",), "workload", one_of(WORKLOADS), "training")
    driver = PROFILES[c.value(node, ("node",), "driver", one_of(tuple(PROFILES)), DEFAULT_PROFILE)]
    ecc = c.value(node, ("node",), "ecc", boolean, True)
    virtualization = c.value(node, ("node",), "virtualization", one_of(VIRTUALIZATION), "none")
    model_name = str(node.get("model", "H100"))
    model = find_model(model_name)
    if model is None:
        names = ", ".join([*ALIASES, *MODELS])
        c.problems.append(
            doc.problem(
                ("node", "model"), f"unknown GPU model {model_name!r}; expected one of: {names}"
            )
        )
        model = MODELS[ALIASES["H100"]]
    mig = _mig(c, node.get("mig"), gpus, model)
    if mig and not model.mig_capable:
        c.problems.append(doc.problem(("node", "mig"), f"{model.name} has no MIG mode"))
    if model.nvlink_generation >= 5 and not driver.blackwell:
        c.problems.append(
            doc.problem(
                ("node", "driver"),
                f"{model.name} needs driver R570 or newer; {driver.name} does not support it",
            )
        )

    faults: list[Fault] = []
    raw_faults = top.get("faults") or []
    if not isinstance(raw_faults, list):
        c.problems.append(doc.problem(("faults",), "must be a list of faults"))
        raw_faults = []
    for i, raw in enumerate(raw_faults):
        fault = _fault(c, raw, ("faults", i), gpus)
        if fault is None:
            continue
        misfit = _misfit(fault, driver, ecc)
        if misfit is not None:
            c.problems.append(doc.problem(("faults", i, misfit[0]), misfit[1]))
        else:
            faults.append(fault)
    c.check()
    return Scenario(
        name=str(top.get("name", default_name)),
        description=str(top.get("description", "")),
        gpus=gpus,
        model=model,
        workload=workload,
        seed=seed,
        faults=tuple(sorted(faults, key=lambda f: f.at)),
        driver=driver,
        mig=mig,
        ecc=ecc,
        virtualization=virtualization,
    )


# Faults of ECC-protected memory: a GPU with ECC off has no such errors, nor events of them.
ECC_FAULT_KINDS = ("ecc_sbe", "ecc_dbe", "row_remap_pending", "row_remap_failure", "retired_pages")


def _misfit(fault: Fault, driver: DriverProfile, ecc: bool) -> tuple[str, str] | None:
    """(field, why) when a fault cannot happen on this node; None when it can."""
    if fault.action is not None and fault.action > driver.recovery_action_max:
        highest = driver.recovery_action_max
        known = f"knows recovery actions 0-{highest}" if highest >= 0 else "has none (field 230)"
        return "action", f"driver {driver.name} {known}"
    if fault.kind in ECC_FAULT_KINDS and not ecc:
        return "kind", f"{fault.kind} needs ECC memory; this node has node.ecc: false"
    return None


MIG_SLICES = (1, 2, 3, 4, 7)  # the compute slices a GPU instance profile can have


def _mig(c: Checker, raw: Any, gpus: int, model: GpuModel) -> dict[int, tuple[str, ...]]:
    """node.mig: a list of {gpu, instances: [profile, ...]}, profiles as nvidia-smi names
    them (`3g.40gb`); at most 7 compute slices and the GPU's memory a GPU."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        c.problems.append(c.doc.problem(("node", "mig"), "must be a list of {gpu, instances}"))
        return {}
    out: dict[int, tuple[str, ...]] = {}
    for i, item in enumerate(raw):
        path: PathKey = ("node", "mig", i)
        data = c.section(item, path, ("gpu", "instances"))
        if not c.require(data, path, "gpu", "the index of the GPU in MIG mode"):
            continue
        gpu = c.value(data, path, "gpu", whole_number(0, gpus - 1), 0)
        instances = data.get("instances")
        if not isinstance(instances, list) or not instances:
            c.problems.append(c.doc.problem((*path, "instances"), "must list instance profiles"))
            continue
        matches = [MIG_PROFILE.match(str(p)) for p in instances]
        bad = [p for p, m in zip(instances, matches, strict=True)
               if m is None or int(m.group(1)) not in MIG_SLICES]  # fmt: skip
        sizes = [(int(m.group(1)), int(m.group(2))) for m in matches if m is not None]
        slices, gigabytes = sum(s for s, _ in sizes), sum(g for _, g in sizes)
        # Profile names round the memory up to whole GB: 7g.80gb on an H100's 79.6 GiB.
        memory = -(-model.memory_bytes // 2**30)
        problem = None
        if bad:
            problem = f"not a MIG profile like 3g.40gb (1-4 or 7g): {bad[0]!r}"
        elif slices > 7:
            problem = f"{slices} compute slices; a GPU has 7"
        elif gigabytes > memory:
            problem = f"{gigabytes} GB of instances; the {model.name} has {memory} GB"
        elif gpu in out:
            problem = f"GPU {gpu} is listed twice"
        if problem is not None:
            c.problems.append(c.doc.problem((*path, "instances"), problem))
        else:
            out[gpu] = tuple(str(p) for p in instances)
    return out


def _kind(value: Any) -> str:
    if value not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {value!r}; expected one of: {', '.join(FAULT_KINDS)}")
    return str(value)


def _fault(c: Checker, raw: Any, path: PathKey, gpus: int) -> Fault | None:
    before = len(c.problems)
    data = c.section(raw, path, ("kind", "gpu", "at", "duration", "code", "error", "action"))
    if not data:
        return None
    has_kind = c.require(data, path, "kind", "the fault kind")
    has_gpu = c.require(data, path, "gpu", "the index of the GPU the fault hits")
    kind = c.value(data, path, "kind", _kind, "")
    gpu = c.value(data, path, "gpu", whole_number(0, gpus - 1), 0)
    at = c.value(data, path, "at", parse_duration, 0.0)
    duration = c.value(data, path, "duration", parse_duration, None)
    code = None
    if kind == "xid" and c.require(data, path, "code", "the XID number"):
        code = c.value(data, path, "code", whole_number(1, 65535), None)
    elif kind != "xid" and "code" in data:
        c.problems.append(c.doc.problem((*path, "code"), "only xid faults take a code"))
    error = None
    if kind in ERROR_FAULT_KINDS and c.require(data, path, "error", "the NVML error, e.g. UNKNOWN"):
        error = c.value(data, path, "error", one_of(tuple(ERRORS)), None)
    elif kind not in ERROR_FAULT_KINDS and "error" in data:
        c.problems.append(
            c.doc.problem((*path, "error"), "only nvml_error and event_wait_error take an error")
        )
    action = None
    if kind == "recovery_action":
        action = c.value(data, path, "action", whole_number(0, 7), 1)
    elif "action" in data:
        c.problems.append(c.doc.problem((*path, "action"), "only recovery_action takes an action"))
    if len(c.problems) > before or not (has_kind and has_gpu):
        return None
    return Fault(kind, gpu, at, duration, code, error, action)


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file by path. Raises FileError."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return from_doc(load(path), path.stem)
    builtin = _scenario_dir() / f"{name_or_path}.yaml"
    if not builtin.exists():
        known = ", ".join(builtin_names())
        message = f"no such scenario file or built-in scenario; built-in: {known}"
        raise FileError([Problem(name_or_path, None, "", message)])
    return from_doc(
        parse(builtin.read_text(encoding="utf-8"), f"builtin:{name_or_path}"), name_or_path
    )
