"""How NVML's answers are told apart: the errors that mean a call is missing, an error's code,
and the error a GPU that cannot be used raises."""

from __future__ import annotations

import ctypes
from typing import Any

NvmlModule = Any  # the pynvml module (over the driver's library, or the simulated one)

ERROR_RESET_REQUIRED = 16  # nvml.h: the GPU requires a reset before it can be used again
ERROR_OTHER = -1  # a failure that is not an NVML error (pynvml raised something else)


class NvmlGpuError(Exception):
    """The GPU answers NVML with errors: nothing could be read, or it needs a reset."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


def handle_key(handle: Any) -> int:
    """A stable identity for an NVML device handle (a ctypes pointer), as events carry it."""
    return ctypes.addressof(handle.contents)


def as_text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def missing_errors(nvml: NvmlModule) -> tuple[type[BaseException], ...]:
    """What a driver or pynvml without a call (or without it for this GPU) raises."""
    names = (
        "NVMLError_NotSupported",
        "NVMLError_FunctionNotFound",
        "NVMLError_ArgumentVersionMismatch",
        "NVMLLibraryMismatchError",  # pynvml >= 12.550, for an unversioned call it lacks
    )
    return tuple(cls for name in names if isinstance(cls := getattr(nvml, name, None), type))


def error_code(exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else ERROR_OTHER


def error_text(nvml: NvmlModule, code: int) -> str:
    """What the library says an error code means, with nvml.h's name for it."""
    if code == ERROR_OTHER:
        return "every NVML call failed"
    try:
        text = as_text(nvml.nvmlErrorString(code))
    except Exception:  # the library cannot say
        text = f"error {code}"
    names = {v: k for k, v in vars(nvml).items() if k.startswith("NVML_ERROR_")}
    return f"NVML answers {text} ({names.get(code, code)})"
