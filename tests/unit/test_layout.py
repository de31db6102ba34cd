"""The package's shape: rooms that follow the data flow, with no loop between them, small
modules, the notifier ignorant of the rules, a Daemon whose collaborators are all handed to
its constructor, and unit tests that never sleep."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The installed package maps exporters/ and tui/ into gpuwatch (pyproject.toml).
PACKAGES = {"gpuwatch": ROOT / "gpuwatch", "gpuwatch.exporters": ROOT / "exporters",
            "gpuwatch.tui": ROOT / "tui"}  # fmt: skip
MAX_LINES = 400
MAX_TOP_MODULES = 12
# The rooms in the order data flows through them, lowest first. A room imports only from its
# own layer or one below it: what a source reads cannot depend on the rules, nor the rules on
# the notifier. Rooms of one layer may use each other as long as no loop forms.
LAYERS: tuple[tuple[str, ...], ...] = (
    # Foundations, and what gpuwatch knows of XIDs, which every source that reports one uses.
    ("gpuwatch", "gpuwatch.compat", "gpuwatch.text", "gpuwatch.clock", "gpuwatch.model",
     "gpuwatch.metrics", "gpuwatch.logs", "gpuwatch.gctune", "gpuwatch.source", "gpuwatch.xid",
     "gpuwatch.web"),
    ("gpuwatch.state",),
    ("gpuwatch.host", "gpuwatch.nvml", "gpuwatch.kernel", "gpuwatch.push",
     "gpuwatch.cloud"),  # sources
    ("gpuwatch.store",),
    # The dcgm-exporter source and the /metrics exposition: both speak Prometheus's text.
    ("gpuwatch.exporters",),
    ("gpuwatch.promql",),
    ("gpuwatch.rules",),
    ("gpuwatch.health",),
    ("gpuwatch.notify", "gpuwatch.actions", "gpuwatch.reports",
     "gpuwatch.life"),  # what follows a verdict
    ("gpuwatch.config",),  # every room's section, read as one file
    ("gpuwatch.daemon",),
    ("gpuwatch.serve",),
    ("gpuwatch.clients", "gpuwatch.tui", "gpuwatch.sim", "gpuwatch.cli", "gpuwatch.client",
     "gpuwatch.__main__"),
)  # fmt: skip


def modules() -> Iterator[tuple[str, Path]]:
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            yield ".".join((package, *parts)).removesuffix(".__init__"), path


def imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def room(module: str, known: set[str]) -> str | None:
    """A module's room: its folder under gpuwatch, or the module itself at the top."""
    if module not in known:
        return None  # a name imported from a module, or not ours
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def test_modules_are_small_and_few_sit_at_the_top() -> None:
    long = {m: n for m, p in modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
    top = [p.name for p in (ROOT / "gpuwatch").glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= MAX_TOP_MODULES, sorted(top)


def test_no_import_loop_between_rooms() -> None:
    found = dict(modules())
    known = set(found)
    edges: dict[str, set[str]] = {}
    for module, path in found.items():
        mine = room(module, known)
        assert mine is not None
        for target in imports(path):
            theirs = room(target, known)
            if theirs is not None and theirs != mine:
                edges.setdefault(mine, set()).add(theirs)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    loops = sorted(f"{a} <-> {b}" for a, bs in edges.items() for b in bs if reaches(b, a))
    assert loops == []


def test_every_room_has_a_layer_and_imports_only_downward() -> None:
    found = dict(modules())
    known = set(found)
    layer = {r: i for i, rooms in enumerate(LAYERS) for r in rooms}
    against = []
    for module, path in found.items():
        mine = room(module, known)
        assert mine in layer, f"{mine} is in no layer of LAYERS"
        for target in imports(path):
            theirs = room(target, known)
            if theirs is not None and layer[theirs] > layer[mine]:
                against.append(f"{module} imports {target}")
    assert sorted(set(against)) == []


def test_notify_imports_nothing_from_rules() -> None:
    for module, path in modules():
        if module.startswith("gpuwatch.notify"):
            assert not [i for i in imports(path) if i.startswith("gpuwatch.rules")], module


def test_nothing_outside_the_daemon_assigns_its_attributes() -> None:
    """`daemon.x = ...` or `running.daemon.x = ...` anywhere but in Daemon itself."""
    offenders = []
    for module, path in modules():
        if module == "gpuwatch.daemon":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else ([node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
            )
            for target in targets:
                if isinstance(target, ast.Attribute):
                    owner = target.value
                    name = (
                        owner.id
                        if isinstance(owner, ast.Name)
                        else (owner.attr if isinstance(owner, ast.Attribute) else "")
                    )
                    if name == "daemon":
                        offenders.append(f"{module}:{node.lineno}")
    assert offenders == []


# What waits on the wall clock, or on another thread or process: a unit test steps the injected
# clock instead, and what needs real threads, processes or sleeps is an integration test.
REAL_TIME = {("time", "sleep"), ("time", "monotonic"), ("time", "time"), ("time", "perf_counter"),
             ("threading", "Thread"), ("threading", "Timer"), ("subprocess", "Popen"),
             ("subprocess", "run"), ("asyncio", "create_subprocess_exec"),
             ("asyncio", "create_subprocess_shell")}  # fmt: skip


def test_unit_tests_run_on_the_injected_clock() -> None:
    here = Path(__file__).parent
    real = []
    for path in sorted(here.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
            call = (owner, node.func.attr)
            waits = call == ("asyncio", "sleep") and not (
                node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == 0
            )  # a turn of the loop is no time
            if waits or call in REAL_TIME:
                real.append(f"{path.name}:{node.lineno} {'.'.join(call)}")
    assert real == []


def test_the_code_cites_nothing_outside_the_repository() -> None:
    """Docstrings and comments point at docs/ and the code, which a reader has; not at a
    design document or tracker numbers the repository does not hold."""
    outside = re.compile(r"DESIGN §|\bissue \d+\b")
    cited = [
        f"{name}: {line.strip()}"
        for name, path in modules()
        for line in path.read_text().splitlines()
        if outside.search(line)
    ]
    assert cited == []
