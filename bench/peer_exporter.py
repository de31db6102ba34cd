"""nvitop-exporter over gpuwatch's simulated NVML library: run by bench/side_by_side.py with
the python of nvitop-exporter's own virtualenv.

The simulated library is put beneath that venv's pynvml before nvitop's first NVML call (as
`gpuwatch run --simulate` puts it beneath gpuwatch's), so both read the same simulated node
through the real nvidia-ml-py. The library times its own entry points; their CPU seconds go
to the file named by --sim-cpu twice a second, so that the bench can take the simulator's
share out of the exporter's CPU, as it does out of gpuwatch's, with the number of power reads
made so far: one per GPU per sample, how many samples the exporter really took.

Usage: peer_exporter.py --repo DIR --scenario FILE --sim-cpu FILE -- [nvitop-exporter args]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True, help="gpuwatch's checkout: its simulator")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--sim-cpu", required=True)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    sys.path.insert(0, args.repo)
    from gpuwatch.clock import SystemClock
    from gpuwatch.sim.library import SimulatedNvml
    from gpuwatch.sim.scenario import load_scenario

    library = SimulatedNvml(load_scenario(args.scenario), SystemClock(), account_cpu=True)
    library.install()

    def write_cpu() -> None:
        while True:
            with open(args.sim_cpu, "w") as out:  # its CPU seconds, and the power reads made
                out.write(f"{library.cpu_used():.6f} {library.called['nvmlDeviceGetPowerUsage']}\n")
            time.sleep(0.5)

    threading.Thread(target=write_cpu, name="sim-cpu", daemon=True).start()
    from nvitop_exporter.cli import main as exporter

    sys.argv = ["nvitop-exporter", *[a for a in args.rest if a != "--"]]
    return exporter()


if __name__ == "__main__":
    sys.exit(main())
