"""deploy/container/Containerfile's build stage, without a container engine (none is on the
test machines, and the base image is not reachable from them): only the files it COPYs are
put in an empty directory, the wheel is built there as its `pip wheel .` does, and that
wheel, installed alone, is a gpuwatch that runs, with its rule packs and scenarios."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "container" / "Containerfile"


def _copied() -> list[str]:
    """The sources the build stage copies (the stage before the second FROM)."""
    build_stage = CONTAINERFILE.read_text().split("\nFROM ")[1]
    paths: list[str] = []
    for line in build_stage.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            paths += line.split()[1:-1]
    return paths


def test_the_build_stage_copies_enough_to_build_a_whole_gpuwatch(tmp_path: Path) -> None:
    context = tmp_path / "src"
    context.mkdir()
    for path in _copied():
        source = ROOT / path.rstrip("/")
        if source.is_dir():
            shutil.copytree(
                source, context / path.rstrip("/"), ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(source, context / path)
    # The Containerfile's `pip wheel .`, offline: the build backend this checkout has.
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(wheels),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert built.returncode == 0, built.stderr
    [wheel] = wheels.glob("gpuwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "gpuwatch/packs/hardware.yaml" in names
    assert "gpuwatch/sim/scenarios/demo.yaml" in names
    assert any(n.startswith("gpuwatch/tui/") for n in names)
    assert any(n.startswith("gpuwatch/exporters/") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert re.search(
        r"^gpuwatch = gpuwatch.cli:main$", zipfile.ZipFile(wheel).read(entry).decode(), re.M
    )
    # Installed alone (its dependencies are this checkout's), it is the gpuwatch that runs.
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    ran = subprocess.run(
        [sys.executable, "-c", "import gpuwatch, gpuwatch.cli; print(gpuwatch.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert ran.returncode == 0 and ran.stdout.startswith(str(target)), ran.stderr
    listed = subprocess.run(
        [sys.executable, "-m", "gpuwatch", "config", "check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert listed.returncode == 0 and "OK (5 rule files" in listed.stdout, listed.stderr
