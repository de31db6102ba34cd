"""The simulated node's kernel log: the lines its drivers print, each at its time.

The NVIDIA driver's load line and a `GPU at PCI:...` line for each GPU at boot; an `NVRM: Xid`
line for every XID the GPUs raise (the driver prints each XID NVML hands out), in the MIG form
for a GPU in MIG mode; a GPU fallen off the bus or failing to initialise; NVSwitch SXids; and
the kernel's AER lines for a pcie_aer fault, at the port above the GPU. The forms are those of
real captures (tests/fixtures/kmsg) and of the sources docs/simulator.md lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatch.sim import driver as d
from gpuwatch.sim.faults import Fault
from gpuwatch.sim.node import SimNode
from gpuwatch.sim.nvml_core import bus_id, uuid_of
from gpuwatch.sim.xids import nvlink5_text
from gpuwatch.text.pci import pci_address
from gpuwatch.xid.known import lookup

# What the driver prints after an XID's number, for the XIDs the scenarios raise.
XID_TEXT = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 6, subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Row remapping failed, no spare rows left.",
    74: "NVLink: fatal error detected on link 0(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}


@dataclass(frozen=True, slots=True)
class Line:
    time: float
    message: str
    priority: int = 4  # warning, as the driver prints its faults


def kernel_lines(node: SimNode, boot: float, salt: int) -> list[Line]:
    """Every line the simulated kernel log prints over the scenario, each at its time."""
    scenario = node.scenario
    lines = [
        Line(
            boot + 5.0,
            f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {scenario.driver.driver_version}",
            5,
        )
    ]
    for gpu in range(scenario.gpus):
        at = bus_id(gpu)[4:-2].lower()  # 0000:18:00
        uuid = uuid_of(scenario.seed, scenario.board(gpu), salt=salt)
        lines.append(Line(boot + 6.0, f"NVRM: GPU at PCI:{at}: {uuid}", 6))
    v2 = int(scenario.driver.name[1:]) >= 575  # how NVLink5 XIDs encode their unit
    for event in node.events:
        if event.event_type != d.EVENT_XID:
            continue
        at = bus_id(event.gpu)[4:-2].lower()
        fault = event.fault
        where = f"PCI:{at}"
        if fault.instance is not None:  # attributed to a MIG instance
            where += f" GPU-I:{fault.instance:02d}"
        if fault.unit:  # NVLink5: no process, the unit and its words
            text = nvlink5_text(event.data, fault.unit, fault.link, v2)
            lines.append(Line(event.printed, f"NVRM: Xid ({where}): {event.data}, {text}"))
            continue
        text = XID_TEXT.get(event.data, lookup(event.data).meaning)
        lines.append(
            Line(
                event.printed,
                f"NVRM: Xid ({where}): {event.data}, pid='<unknown>', name=<unknown>, {text}",
            )
        )
        if event.data == 79:
            lines.append(
                Line(event.printed, f"NVRM: GPU {pci_address(at)}: GPU has fallen off the bus.")
            )
    for f in scenario.faults:
        when = node.start + f.at
        if f.kind == "gpu_missing":
            lines.append(
                Line(
                    when,
                    f"NVRM: GPU {pci_address(bus_id(f.gpu))}: "
                    "RmInitAdapter failed! (0x22:0x56:884)",
                    3,
                )
            )
        elif f.kind == "sxid":
            lines.extend(_sxid_lines(f, when))
        elif f.kind == "pcie_aer":
            lines.extend(_aer_lines(f, when))
    return lines


def upstream_port(gpu: int, root: bool = False) -> str:
    """The address of the PCIe switch's downstream port above GPU `gpu`, or with `root` of
    the root port above the switch (the simulated host's layout: root port, switch upstream
    port, switch downstream port, GPU)."""
    domain, bus = pci_address(bus_id(gpu)).split(":")[:2]
    return f"{domain}:{int(bus, 16) - (3 if root else 1):02x}:{'01' if root else '00'}.0"


# What the kernel's AER driver prints for an error the switch port above a GPU detected on
# its link as the receiver (drivers/pci/pcie/aer.c, the wording of Linux 6.8 and later), for
# each severity: the error's layer and an error bit of that severity (aer.c's names).
AER_TEXT = {
    "correctable": ("Correctable", "Data Link Layer", "[ 6] BadTLP"),
    "nonfatal": ("Uncorrectable (Non-Fatal)", "Transaction Layer",
                 "[12] TLP                    (First)"),
    "fatal": ("Uncorrectable (Fatal)", "Transaction Layer", "[ 5] SDES                   (First)"),
}  # fmt: skip


def _aer_lines(fault: Fault, when: float) -> list[Line]:
    """A PCIe error the switch port above the GPU saw, as the kernel prints it: the root
    port received the error message (aer_print_port_info), the port's error block follows
    (aer_print_error), then the recovery that fails for want of an AER-aware NVIDIA driver,
    reset and recovery printed by the port (as in Red Hat's solution 7128107)."""
    port, gpu = upstream_port(fault.gpu), pci_address(bus_id(fault.gpu))
    root = upstream_port(fault.gpu, root=True)
    severity, layer, bit = AER_TEXT[fault.severity]
    level = 4 if fault.severity == "correctable" else 3  # KERN_WARNING, KERN_ERR
    block = f"pcieport {port}: PCIe Bus Error: severity={severity}, type={layer}, (Receiver ID)"
    lines = [
        Line(when, f"pcieport {root}: AER: {severity} error message received from {port}", level),
        Line(when, block, level),
        Line(when, f"pcieport {port}:    {bit}", level),
    ]
    if fault.severity != "correctable":
        lines.append(Line(when, f"nvidia {gpu}: AER: can't recover (no error_detected callback)"))
    if fault.severity == "fatal":
        lines.append(Line(when, f"pcieport {port}: AER: Downstream Port link has been reset (0)"))
        lines.append(Line(when, f"pcieport {port}: AER: device recovery failed"))
    return lines


def _sxid_lines(fault: Fault, when: float) -> list[Line]:
    """An SXid as the NVSwitch driver prints it: the first line, then its details."""
    head = f"nvidia-nvswitch{fault.switch}: SXid (PCI:{switch_address(fault.switch)}): {fault.code}"
    level = "Fatal" if fault.fatal else "Non-fatal"
    return [
        Line(when, f"{head}, {level}, Link 32 egress non-posted PRIV error (First)", 3),
        Line(
            when,
            f"{head}, Severity {1 if fault.fatal else 0} Engine instance 32 Sub-engine instance 00",
            3,
        ),
        Line(when, f"{head}, Data {{0x00000001, 0x00000000, 0x00000000, 0x00000000}}", 3),
    ]


def switch_address(switch: int) -> str:
    return f"0002:{switch * 4 + 7:02x}:00.0"
