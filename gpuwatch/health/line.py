"""The node's verdict as one line, `unhealthy: GPU 1 is lost: ...; drain the node (+1 more)`:
what `gpuwatch health` prints, what Slurm's drain reason and node-problem-detector's condition
message carry, and what the daemon writes to its verdict file. Made from the node's API
payload, so the daemon and every client say the same."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

VERDICTS = ("healthy", "degraded", "unhealthy")


def health_line(node: Mapping[str, Any], where: str = "") -> str:
    """`VERDICT: why`; `unknown: ...` when there is no verdict yet (`where` names the
    daemon asked, for a client)."""
    verdict = str(node.get("verdict", "unknown"))
    reasons = [str(r) for r in node.get("reasons", []) if r]
    if verdict not in VERDICTS:
        prefix = f"{where}: " if where else ""
        return f"unknown: {prefix}{'; '.join(reasons) or 'no verdict yet'}"
    actions = [str(a) for a in node.get("actions", [])]
    if reasons:
        more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
        action = f"; {actions[0]}" if actions else ""
        return f"{verdict}: {reasons[0]}{action}{more}"
    return f"{verdict}: {_nothing_new(node)}"


def _nothing_new(node: Mapping[str, Any]) -> str:
    """A verdict with no reasons: "nothing wrong" only when nothing is acknowledged either and
    every GPU answers; an operator reading "healthy" must not miss a GPU that is down."""
    gpus = node.get("gpus", [])
    down = [f"GPU {g.get('index')} is {g.get('status')}" for g in gpus if g.get("status") != "ok"]
    acked = [str(c.get("reason", "")) for c in node.get("acknowledged", [])]
    if not down and not acked:
        return f"{len(gpus)} GPUs, nothing wrong"
    said = down + [f"acknowledged: {reason}" for reason in acked]
    more = f" (+{len(said) - 1} more)" if len(said) > 1 else ""
    return f"{len(gpus)} GPUs, {said[0]}{more}"
