"""NVIDIA's XID catalog: what each error means, how serious it is, and what to do.

From NVIDIA's XID catalog for Ampere and newer GPUs (docs.nvidia.com/deploy/xid-errors,
"Analyzing Xid Errors with the Xid Catalog"), XIDs 1-172. The class follows the catalog's
immediate action: `critical` for reset the GPU or reboot (the GPU needs it), `warning` for
contact support or check the hardware, and for the NVLink5 XIDs whose sub-code alone says
whether they are fatal (watch it), `application` for restart the application (the GPU stays
healthy), `info` for no action (context for the XIDs around it), and `driver` for XID 154,
whose text carries the driver's recovery action. XIDs the catalog lists as unused on A100
and newer are `warning`: on an older GPU they may mean something, and NVIDIA's answer for
them is to contact support.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Xid:
    code: int
    meaning: str
    xid_class: str
    action: str

    def as_data(self) -> dict[str, int | float | str]:
        """What an event carries about its XID."""
        return {
            "xid": self.code,
            "class": self.xid_class,
            "meaning": self.meaning,
            "action": self.action,
        }


# What NVIDIA's resolution bucket (the immediate action) makes of a GPU, as a class.
APP = "Restart the application; if it repeats on this GPU, run diagnostics."
RESET = "Drain the GPU's work and reset it; if it recurs, contact NVIDIA or the vendor."
NONE = "None needed: NVIDIA asks for no action; correlate with the XIDs around it."
UNUSED = (
    "NVIDIA lists it as unused on A100 and newer; on an older GPU see NVIDIA's catalog for "
    "older GPUs; otherwise contact NVIDIA support."
)
ENGINE = "Engine exception (copy, video, JPEG or optical-flow engine)"


def _entries() -> dict[int, Xid]:
    unused = (*range(1, 8), 9, 10, 12, *range(15, 25), *range(26, 31), *range(33, 37), 42, 47,
              *range(49, 54), *range(55, 60), 61, 65, 73, 81, 87, 90, 91, *range(111, 119),
              *range(122, 126), 138, 152, 153)  # fmt: skip
    engines = (39, 40, 41, 60, 70, 71, 72, 75, 76, 77, 82, 83, 84, 85, 86, 88, 89,
               *range(96, 106), *range(126, 136), 139)  # fmt: skip
    rows: list[tuple[tuple[int, ...], str, str, str]] = [
        (unused, "Not used on A100 and newer GPUs", "warning", UNUSED),
        ((8,), "GPU stopped processing (idle timeout)", "application", APP),
        ((11, 25), "Invalid or corrupted push buffer stream", "application",
         "Restart the application; check the application and its CUDA version."),
        ((13,), "Graphics engine exception, usually an application bug", "application",
         "Restart the application; debug it with compute-sanitizer or cuda-gdb; if it repeats "
         "on the same GPU with other applications, run diagnostics."),
        ((14,), "Injected (fake) error from user space", "info", NONE),
        ((31,), "GPU memory page fault (illegal address)", "application",
         "Restart the application; debug it with compute-sanitizer or cuda-gdb; if it repeats "
         "on one GPU, run diagnostics."),
        ((32,), "Corrupted push buffer from the DMA controller, often PCIe quality", "application",
         "Restart the application; if it repeats, check the PCIe link (replays, AER)."),
        ((37, 38), "Driver firmware error", "info", NONE),
        (engines, ENGINE, "application", APP),
        ((43,), "GPU stopped processing a channel (an application's fault); the GPU stays "
         "healthy", "info", NONE),
        ((44,), "Graphics engine fault during a context switch", "info", NONE),
        ((45,), "Preemptive cleanup (kill, Ctrl-C, reset, or after an earlier error)", "info",
         "Follow the XID logged next to it; alone, restart the Fabric Manager if it runs."),
        ((46,), "GPU timeout", "critical", RESET),
        ((48,), "Double-bit ECC error", "critical",
         "Reset the GPU; together with XID 63 or 64, drain the node and reset."),
        ((54,), "Auxiliary power not connected to the board", "warning",
         "Check the board's power cables and connectors."),
        ((62,), "Micro-controller halt", "critical", RESET),
        ((63,), "Row remap or page retirement recorded", "info",
         "Nothing now; reset the GPU when convenient to activate it."),
        ((64,), "Row remap or page retirement failed", "critical",
         "Reset the GPU; if it recurs, RMA it."),
        ((66, 67), "Illegal register access by the driver", "info", NONE),
        ((68,), "Video decoder (NVDEC0) exception", "application", APP),
        ((69,), "Graphics engine class error", "application", APP),
        ((74,), "NVLink error", "critical",
         "Reset the GPU and check the link; the fault may be the GPU or switch at the other "
         "end."),
        ((78,), "vGPU start error", "warning", "Update the vGPU software and firmware."),
        ((79,), "GPU has fallen off the bus", "critical",
         "Drain the node and reboot it; reseat or RMA the GPU if it does not come back."),
        ((80,), "Corrupted data sent to the GPU", "application", APP),
        # The errors were corrected, but a storm of them is wear: NVIDIA's DCGM and the
        # catalog ask to watch it, a warning.
        ((92,), "Excessive single-bit ECC error rate", "warning",
         "Watch the ECC and row-remap trends on this GPU; reset it when idle, and run "
         "diagnostics (dcgmi diag -r 3) if the rate stays high."),
        ((93,), "InfoROM wear limit reached (as provisioned)", "info",
         "None needed; clear the provisioned limit with nvflash if it was not intended."),
        ((94,), "Contained memory error (one application affected)", "application",
         "Restart the affected application; reset the GPU when convenient."),
        ((95,), "Uncontained memory error", "critical", RESET),
        ((106, 107), "SMBPBI test message", "info", NONE),
        ((108,), "NVLink remote translation error", "info", NONE),
        ((109,), "Context-switch timeout", "critical", RESET),
        ((110,), "Security fault", "critical",
         "Revert recent hardware changes and cold-reset the node; then contact the vendor."),
        ((119,), "GSP RPC timeout", "critical", RESET),
        ((120,), "GSP error", "critical", RESET),
        ((121,), "Corrected C2C link errors (Grace to GPU)", "info",
         "None needed; reset the GPU in a service window to retrain the link."),
        ((136,), "NVLink training failed", "critical",
         "Reset the GPU; inspect the link and its cables."),
        ((137,), "NVLink privilege error (illegal peer access, usually an application bug)",
         "info", "None needed for the GPU; debug the application's peer accesses."),
        ((140,), "Unrecovered ECC error escaped", "critical", RESET),
        ((141,), "CUDA fast path error", "info", NONE),
        ((142,), "Video encoder (NVENC3) error", "warning", "Contact NVIDIA support."),
        ((143,), "GPU initialisation error", "critical", RESET),
        # NVLink5 (Blackwell): fatal or not by the sub-code in the driver's text, which NVML
        # events do not carry. A fatal one comes with XID 154's recovery action, which has
        # its own alert; alone, the GPU is held degraded until its text is read. XID 150 is
        # not among them: NVIDIA's 144-150 decode sheet lists only fatal sub-codes for it,
        # each with RESET_GPU.
        ((150,), "NVLink5 fatal error (every sub-code NVIDIA lists for it is fatal)", "critical",
         RESET),
        ((144, 145, 146, 147, 148), "NVLink5 error; fatal or not by its sub-code in the "
         "driver's text", "warning",
         "Read the sub-code in the driver's text (dmesg) against NVIDIA's NVLink5 table; "
         "follow XID 154 if it follows."),
        ((149,), "NVLink5 link fatal (NETIR)", "critical",
         "Reset the GPU; investigate the link and the device at its other end."),
        ((151,), "Key rotation error (confidential computing)", "warning",
         "Restart the VM."),
        ((154,), "The driver's recovery action changed (None, GPU Reset Required, Node "
         "Reboot Required, Drain P2P, Drain and Reset; newer drivers add IMEX domain recovery, "
         "bus reset and system reboot)", "driver",
         "Do what the driver's text says: it is authoritative."),
        ((155,), "NVLink software-defined error (a link taken down on purpose)", "critical",
         RESET),
        ((156,), "Resource retirement event", "critical", RESET),
        ((157,), "Resource retirement failure (no repairs are possible: no spare resources "
         "left)", "warning", "Contact NVIDIA support or the vendor: the GPU cannot repair "
         "more of its memory; plan to replace it."),
        ((158,), "GPU fatal timeout", "critical", RESET),
        ((159,), "CHI non-data error (C2C)", "warning", "Check the UVM driver; contact NVIDIA."),
        ((160, 161), "Channel retirement event or failure", "info", NONE),
        ((162,), "Power smoothing circuitry re-engaged", "info", NONE),
        ((163, 164, 165), "Power smoothing circuitry disengaged or near or at end of life",
         "warning", "Check the power swings the facility can take; plan to replace the GPU "
         "if power smoothing is needed."),
        ((166, 170), "NVLink event in confidential-computing mode", "warning",
         "Check the confidential-computing link configuration."),
        ((167,), "PCIe fatal timeout", "critical", RESET),
        ((168,), "Reduced GPU memory capacity (errors in the write-protected region)",
         "warning", "Enable ECC (for row remapping) or reboot the node."),
        ((169,), "Internal micro-controller (SEC2) halt", "critical", RESET),
        ((171, 172), "Detail of an uncorrectable DRAM or SRAM error (with XID 48)", "info",
         "Follow the XID 48 it comes with."),
    ]  # fmt: skip
    out: dict[int, Xid] = {}
    for codes, meaning, cls, action in rows:
        for code in codes:
            assert code not in out, f"XID {code} twice in the catalog"
            out[code] = Xid(code, meaning, cls, action)
    return out


CATALOG: Mapping[int, Xid] = MappingProxyType(_entries())


# What this catalog is: a reader of "unknown to this catalog" must know how old it is.
CATALOG_VERSION = (
    "gpuwatch's XID catalog, from NVIDIA's XID catalog for Ampere and newer (XIDs 1-172)"
)


def lookup(code: int) -> Xid:
    """The catalog entry, or an honest 'unknown' for a code this catalog lacks. NVIDIA adds
    XIDs with new drivers (155, 156, 158 came after this catalog), so an unknown one is not
    harmless: the verdict holds the GPU degraded, as for a warning XID."""
    found = CATALOG.get(code)
    if found is not None:
        return found
    return Xid(
        code,
        f"Unknown to {CATALOG_VERSION}",
        "unknown",
        "Read the driver's text for it (`dmesg | grep -i xid`) and NVIDIA's XID catalog for "
        "this driver; until then treat the GPU as degraded.",
    )


# XIDs a program's own fault raises, with no error counter or state of the GPU changed:
# NVIDIA's Kubernetes device plugin skips these when it judges a GPU, less 109 (a context
# switch timeout), which this catalog holds critical.
APPLICATION_FAULTS = frozenset({13, 31, 43, 45, 68})


def xid_event_text(code: int, gpu: int | None) -> tuple[str, dict[str, int | float | str]]:
    """The journal message and data of an XID event, whichever source saw it."""
    xid = lookup(code)
    return f"XID {code} on GPU {gpu}: {xid.meaning}", xid.as_data()
