"""Scenario files: a simulated node and a list of timed faults (DESIGN §7)."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwatch.sim.models import ALIASES, MODELS, GpuModel, find_model
from gpuwatch.units import parse_duration
from gpuwatch.yamlfile import FileError, Problem, YamlDoc, load, parse

WORKLOADS = ("training", "inference", "idle")

# Fault kinds the simulator plays today. The rest of DESIGN §7's kinds are rejected at load
# with a clear message until the issues that own them add them here.
FAULT_KINDS = ("xid", "nvml_hang", "fall_off_bus", "thermal_runaway", "hw_slowdown", "power_brake")
PLANNED_FAULT_KINDS = (
    "ecc_sbe",
    "ecc_dbe",
    "row_remap_pending",
    "row_remap_failure",
    "retired_pages",
    "nvlink_down",
    "nvlink_crc_storm",
    "pcie_replay_storm",
    "recovery_action",
    "nccl_hang",
    "idle_with_memory",
    "nan_loss",
    "step_stall",
)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    gpu: int
    at: float  # seconds after the scenario starts
    duration: float | None = None  # None: until the end
    code: int | None = None  # XID code, for `xid`

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

    def with_gpus(self, gpus: int) -> Scenario:
        return Scenario(
            self.name,
            self.description,
            gpus,
            self.model,
            self.workload,
            self.seed,
            tuple(f for f in self.faults if f.gpu < gpus),
        )


def _scenario_dir() -> Path:
    return Path(str(resources.files("gpuwatch.sim") / "scenarios"))


def builtin_names() -> list[str]:
    return sorted(p.stem for p in _scenario_dir().glob("*.yaml"))


def _int_in(doc: YamlDoc, data: dict[str, Any], path: tuple[str | int, ...], key: str,
            low: int, high: int, problems: list[Problem], default: int | None) -> int | None:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        problems.append(doc.problem((*path, key), f"expected a whole number from {low} to {high}, got {value!r}"))
        return None
    return value


def from_doc(doc: YamlDoc, default_name: str) -> Scenario:
    problems: list[Problem] = []
    data = doc.data if isinstance(doc.data, dict) else None
    if data is None:
        raise FileError([doc.problem((), "a scenario must be a mapping with 'node' and 'faults'")])
    for key in data:
        if key not in ("name", "description", "node", "faults"):
            problems.append(doc.problem((key,), "unknown key; expected one of: name, description, node, faults"))
    node = data.get("node") or {}
    if not isinstance(node, dict):
        raise FileError([doc.problem(("node",), "must be a mapping with gpus, model, workload, seed")])
    for key in node:
        if key not in ("gpus", "model", "workload", "seed"):
            problems.append(doc.problem(("node", key), "unknown key; expected one of: gpus, model, workload, seed"))
    gpus = _int_in(doc, node, ("node",), "gpus", 1, 1024, problems, 8) or 1
    seed = _int_in(doc, node, ("node",), "seed", 0, 2**31, problems, 1) or 0
    model_name = str(node.get("model", "H100"))
    model = find_model(model_name)
    if model is None:
        names = ", ".join([*ALIASES, *MODELS])
        problems.append(doc.problem(("node", "model"), f"unknown GPU model {model_name!r}; expected one of: {names}"))
        model = MODELS[ALIASES["H100"]]
    workload = node.get("workload", "training")
    if workload not in WORKLOADS:
        problems.append(doc.problem(("node", "workload"), f"expected one of {', '.join(WORKLOADS)}, got {workload!r}"))
        workload = "training"

    faults: list[Fault] = []
    raw_faults = data.get("faults") or []
    if not isinstance(raw_faults, list):
        problems.append(doc.problem(("faults",), "must be a list of faults"))
        raw_faults = []
    for i, raw in enumerate(raw_faults):
        fault = _fault(doc, raw, ("faults", i), gpus, problems)
        if fault is not None:
            faults.append(fault)
    if problems:
        raise FileError(problems)
    return Scenario(
        name=str(data.get("name", default_name)),
        description=str(data.get("description", "")),
        gpus=gpus,
        model=model,
        workload=str(workload),
        seed=seed,
        faults=tuple(sorted(faults, key=lambda f: f.at)),
    )


def _fault(doc: YamlDoc, raw: Any, path: tuple[str | int, ...], gpus: int,
           problems: list[Problem]) -> Fault | None:
    if not isinstance(raw, dict):
        problems.append(doc.problem(path, "a fault must be a mapping with kind, gpu and at"))
        return None
    before = len(problems)
    for key in raw:
        if key not in ("kind", "gpu", "at", "duration", "code"):
            problems.append(doc.problem((*path, key), "unknown key; expected one of: kind, gpu, at, duration, code"))
    kind = raw.get("kind")
    if kind in PLANNED_FAULT_KINDS:
        problems.append(doc.problem((*path, "kind"), f"fault kind {kind!r} is not simulated yet; available: {', '.join(FAULT_KINDS)}"))
    elif kind not in FAULT_KINDS:
        problems.append(doc.problem((*path, "kind"), f"unknown fault kind {kind!r}; expected one of: {', '.join(FAULT_KINDS)}"))
    gpu = _int_in(doc, raw, path, "gpu", 0, gpus - 1, problems, None) if "gpu" in raw else None
    if "gpu" not in raw:
        problems.append(doc.problem(path, "missing 'gpu' (the index of the GPU the fault hits)"))
    at = duration = None
    try:
        at = parse_duration(raw.get("at", 0))
    except ValueError as exc:
        problems.append(doc.problem((*path, "at"), str(exc)))
    if raw.get("duration") is not None:
        try:
            duration = parse_duration(raw["duration"])
        except ValueError as exc:
            problems.append(doc.problem((*path, "duration"), str(exc)))
    code = None
    if kind == "xid":
        code = _int_in(doc, raw, path, "code", 1, 65535, problems, None) if "code" in raw else None
        if "code" not in raw:
            problems.append(doc.problem(path, "an xid fault needs 'code' (the XID number)"))
    elif "code" in raw:
        problems.append(doc.problem((*path, "code"), "only xid faults take a code"))
    if len(problems) > before or gpu is None or at is None:
        return None
    return Fault(kind=str(kind), gpu=gpu, at=at, duration=duration, code=code)


def load_scenario(name_or_path: str) -> Scenario:
    """A built-in scenario by name, or a scenario file by path. Raises FileError."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return from_doc(load(path), path.stem)
    builtin = _scenario_dir() / f"{name_or_path}.yaml"
    if not builtin.exists():
        raise FileError([Problem(name_or_path, None, "", f"no such scenario file or built-in scenario; built-in: {', '.join(builtin_names())}")])
    return from_doc(parse(builtin.read_text(encoding="utf-8"), f"builtin:{name_or_path}"), name_or_path)
