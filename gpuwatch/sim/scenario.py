"""Scenario files: a simulated node and a list of timed faults (docs/simulator.md)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwatch.sim.driver import DEFAULT_PROFILE, PROFILES, DriverProfile
from gpuwatch.sim.fault_entries import read_fault
from gpuwatch.sim.faults import (
    Fault,
    fault_misfit,
)
from gpuwatch.sim.mig import MIG_PROFILE, instance_misfit
from gpuwatch.sim.models import ALIASES, MODELS, GpuModel, find_model
from gpuwatch.text.yamlfile import (
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


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    gpus: int
    models: tuple[GpuModel, ...]  # one a GPU
    workload: str
    seed: int
    faults: tuple[Fault, ...] = field(default_factory=tuple)
    driver: DriverProfile = PROFILES[DEFAULT_PROFILE]
    mig: dict[int, tuple[str, ...]] = field(default_factory=dict)  # GPU -> instance profiles
    ecc: bool = True  # ECC mode enabled (off: every ECC counter answers NOT_SUPPORTED)
    virtualization: str = "none"  # "vgpu_guest": a VM with a vGPU, as GRID guests see it
    ib_ports: int = 0  # InfiniBand ports, one a NIC (gpuwatch.sim.host)
    nvswitches: int = 0
    # The board in each slot, by number; empty: each slot holds its own. A board's UUID and
    # serial are its own wherever it sits (NVML's reference: the serial "matches the serial
    # number tag that is physically attached to the board", the UUID is "immutable"); its PCI
    # address is the slot's. So a moved board keeps its identity at a new address and index.
    boards: tuple[int, ...] = ()

    def board(self, gpu: int) -> int:
        """The number of the board in slot `gpu`, which its UUID and serial derive from."""
        return self.boards[gpu] if gpu < len(self.boards) else gpu

    @property
    def model(self) -> GpuModel:
        """The first GPU's model: the node's, unless it mixes models."""
        return self.models[0]

    def with_gpus(self, gpus: int) -> Scenario:
        return replace(
            self,
            gpus=gpus,
            models=(self.models + (self.models[-1],) * gpus)[:gpus],
            faults=tuple(f for f in self.faults if f.gpu < gpus),
            mig={g: p for g, p in self.mig.items() if g < gpus},
            boards=self.boards[:gpus] if len(self.boards) >= gpus else (),
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
        (
            "gpus",
            "model",
            "workload",
            "seed",
            "driver",
            "mig",
            "ecc",
            "virtualization",
            "ib_ports",
            "nvswitches",
            "boards",
        ),
    )
    ib_ports = c.value(node, ("node",), "ib_ports", whole_number(0, 64), 0)
    nvswitches = c.value(node, ("node",), "nvswitches", whole_number(0, 16), 0)
    seed = c.value(node, ("node",), "seed", whole_number(0, 2**31), 1)
    workload = c.value(node, ("node",), "workload", one_of(WORKLOADS), "training")
    driver = PROFILES[c.value(node, ("node",), "driver", one_of(tuple(PROFILES)), DEFAULT_PROFILE)]
    ecc = c.value(node, ("node",), "ecc", boolean, True)
    virtualization = c.value(node, ("node",), "virtualization", one_of(VIRTUALIZATION), "none")
    raw_models = node.get("model", "H100")
    # A list names each GPU's model (a node that mixes them); its length is the GPU count.
    names = [str(m) for m in raw_models] if isinstance(raw_models, list) else None
    gpus = c.value(node, ("node",), "gpus", whole_number(1, 1024), len(names) if names else 8)
    if names is not None and len(names) != gpus:
        c.problems.append(
            doc.problem(("node", "model"), f"lists {len(names)} models for {gpus} GPUs")
        )
    if names == []:
        names = ["H100"]  # the problem is said; go on checking the rest
    models = _models(c, names or [str(raw_models)] * gpus, gpus, names is not None)
    mig = _mig(c, node.get("mig"), gpus, models)
    for g in mig:
        if not models[g].mig_capable:
            c.problems.append(doc.problem(("node", "mig"), f"{models[g].name} has no MIG mode"))
    blackwell = next((m for m in models if m.nvlink_generation >= 5), None)
    if blackwell is not None and not driver.blackwell:
        c.problems.append(
            doc.problem(
                ("node", "driver"),
                f"{blackwell.name} needs driver R570 or newer; {driver.name} does not support it",
            )
        )

    boards = _boards(c, node.get("boards"), gpus, doc)
    faults: list[Fault] = []
    raw_faults = top.get("faults") or []
    if not isinstance(raw_faults, list):
        c.problems.append(doc.problem(("faults",), "must be a list of faults"))
        raw_faults = []
    for i, raw in enumerate(raw_faults):
        for fault in read_fault(
            c, raw, ("faults", i), gpus, ib_ports=ib_ports, nvswitches=nvswitches
        ):
            misfit = fault_misfit(fault, driver, ecc, models[fault.gpu]) or instance_misfit(
                fault, mig.get(fault.gpu, ())
            )
            if misfit is not None:
                c.problems.append(doc.problem(("faults", i, misfit[0]), misfit[1]))
                break
            faults.append(fault)
    c.check()
    return Scenario(
        name=str(top.get("name", default_name)),
        description=str(top.get("description", "")),
        gpus=gpus,
        models=models,
        workload=workload,
        seed=seed,
        faults=tuple(sorted(faults, key=lambda f: f.at)),
        driver=driver,
        mig=mig,
        ecc=ecc,
        virtualization=virtualization,
        ib_ports=ib_ports,
        nvswitches=nvswitches,
        boards=boards,
    )


def _boards(c: Checker, raw: object, gpus: int, doc: YamlDoc) -> tuple[int, ...]:
    """`boards`: a list of the board numbers 0 to gpus-1, each once, one a slot."""
    if raw is None:
        return ()
    if (
        not isinstance(raw, list)
        or any(isinstance(b, bool) or not isinstance(b, int) for b in raw)
        or sorted(raw) != list(range(gpus))
    ):
        c.problems.append(
            doc.problem(
                ("node", "boards"),
                f"must list the board in each of the {gpus} slots: each of 0 to {gpus - 1} once",
            )
        )
        return ()
    return tuple(raw)


MIG_SLICES = (1, 2, 3, 4, 7)  # the compute slices a GPU instance profile can have


def _models(c: Checker, names: list[str], gpus: int, listed: bool) -> tuple[GpuModel, ...]:
    out: list[GpuModel] = []
    for i, name in enumerate(names[:gpus]):
        model = find_model(name)
        if model is None:
            known = ", ".join([*ALIASES, *MODELS])
            path: PathKey = ("node", "model", i) if listed else ("node", "model")
            c.problems.append(
                c.doc.problem(path, f"unknown GPU model {name!r}; expected one of: {known}")
            )
            model = MODELS[ALIASES["H100"]]
        out.append(model)
    return tuple(out + out[-1:] * (gpus - len(out)))


def _mig(
    c: Checker, raw: Any, gpus: int, models: tuple[GpuModel, ...]
) -> dict[int, tuple[str, ...]]:
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
        bad = [
            p
            for p, m in zip(instances, matches, strict=True)
            if m is None or int(m.group(1)) not in MIG_SLICES
        ]
        sizes = [(int(m.group(1)), int(m.group(2))) for m in matches if m is not None]
        slices, gigabytes = sum(s for s, _ in sizes), sum(g for _, g in sizes)
        # Profile names round the memory up to whole GB: 7g.80gb on an H100's 79.6 GiB.
        model = models[gpu]
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
