"""Run every Prometheus rule file under a directory through promtool and gpuwatch, and list
where they disagree.

    python tools/compare_rules.py DIR [DIR...] [--promtool PATH] [--json]

A file is the rule-file format (`groups:`) or a Kubernetes PrometheusRule (its `spec` is
checked, every document of a multi-document file). For each file both tools load it:
promtool with `promtool check rules`, gpuwatch with its own loader (what `gpuwatch rules
check` and the daemon use). A disagreement is a file one accepts and the other refuses; for
each, gpuwatch's reasons are printed with file:line. The summary counts files, rules and
disagreements per directory, the table docs/rules.md records.

Needs promtool on PATH (Debian package `prometheus`). Reads only the files it is given;
writes PrometheusRule specs to a temporary directory it removes."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.rules.files import load_rule_file
from gpuwatch.text.yamlfile import FileError

SUFFIXES = (".yml", ".yaml", ".rules", ".json")


@dataclass
class Verdict:
    file: str
    rules: int = 0
    promtool_ok: bool = False
    gpuwatch_ok: bool = False
    promtool_errors: list[str] = field(default_factory=list)
    gpuwatch_errors: list[str] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return self.promtool_ok == self.gpuwatch_ok


def rule_documents(path: Path) -> tuple[list[dict[str, Any]], bool] | None:
    """The rule-file documents in a file and whether they are PrometheusRule specs; None when
    the file holds neither a rule file (`groups:` at the top) nor a PrometheusRule, or is not
    YAML at all (such a file is counted as skipped)."""
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return None
    specs = [
        d["spec"]
        for d in docs
        if isinstance(d, dict)
        and d.get("kind") == "PrometheusRule"
        and isinstance(d.get("spec"), dict)
    ]
    if specs:
        return specs, True
    plain = [d for d in docs if isinstance(d, dict) and "groups" in d and "kind" not in d]
    return (plain, False) if plain else None


def count_rules(docs: list[dict[str, Any]]) -> int:
    return sum(
        len(g.get("rules") or [])
        for d in docs
        for g in (d.get("groups") or [])
        if isinstance(g, dict)
    )


def promtool_check(promtool: str, path: Path) -> tuple[bool, list[str]]:
    done = subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [
        line.strip()
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and not line.startswith(("Checking", "  SUCCESS", "  FAILED"))
    ]
    return done.returncode == 0, lines


def gpuwatch_check(path: Path) -> tuple[bool, list[str]]:
    try:
        load_rule_file(str(path))
    except FileError as exc:
        return False, [str(p) for p in exc.problems]
    return True, []


def compare_file(promtool: str, original: Path, work: Path, shown: str) -> Verdict | None:
    found = rule_documents(original)
    if found is None:
        return None
    docs, from_kubernetes = found
    verdict = Verdict(shown, count_rules(docs), True, True)
    if not from_kubernetes:
        # a rule file is checked as it is, by both, whatever it holds (promtool reads only
        # the first of several YAML documents; gpuwatch refuses a second)
        checked = [(original, shown)]
    else:
        checked = []
        for i, doc in enumerate(docs):
            target = work / f"{original.stem}.{i}.yaml"
            target.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
            checked.append((target, f"{shown} (PrometheusRule {i + 1}, spec)"))
    for path, name in checked:
        ok, errors = promtool_check(promtool, path)
        verdict.promtool_ok &= ok
        verdict.promtool_errors += [e.replace(str(path), name) for e in errors]
        ok, errors = gpuwatch_check(path)
        verdict.gpuwatch_ok &= ok
        verdict.gpuwatch_errors += [e.replace(str(path), name) for e in errors]
    return verdict


def compare_dir(promtool: str, root: Path) -> tuple[list[Verdict], list[str]]:
    """Verdicts on every rule file under `root` (a directory or one file), and the files
    skipped because they hold no rule group."""
    verdicts: list[Verdict] = []
    skipped: list[str] = []
    if root.is_file():
        files, base = [root], root.parent
    else:
        files = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        base = root
    with tempfile.TemporaryDirectory(prefix="compare-rules-") as tmp:
        for path in files:
            shown = str(path.relative_to(base))
            verdict = compare_file(promtool, path, Path(tmp), shown)
            if verdict is None:
                skipped.append(shown)
            else:
                verdicts.append(verdict)
    return verdicts, skipped


def summary(root: Path, verdicts: list[Verdict], skipped: list[str]) -> str:
    both = sum(v.promtool_ok and v.gpuwatch_ok for v in verdicts)
    only_p = [v for v in verdicts if v.promtool_ok and not v.gpuwatch_ok]
    only_g = [v for v in verdicts if v.gpuwatch_ok and not v.promtool_ok]
    rules = sum(v.rules for v in verdicts)
    loaded = sum(v.rules for v in verdicts if v.gpuwatch_ok)
    return (
        f"{root}: {len(verdicts)} files, {rules} rules; promtool accepts "
        f"{sum(v.promtool_ok for v in verdicts)}, gpuwatch loads "
        f"{sum(v.gpuwatch_ok for v in verdicts)} ({loaded} rules); both {both}; "
        f"only promtool {len(only_p)}; only gpuwatch {len(only_g)}"
        + (f"; skipped {len(skipped)} holding no rule group" if skipped else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--promtool", default=shutil.which("promtool") or "promtool")
    parser.add_argument("--json", action="store_true", help="every verdict as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="name the skipped files")
    args = parser.parse_args(argv)
    disagreements = 0
    every: dict[str, list[dict[str, Any]]] = {}
    missing = [str(p) for p in args.dirs if not p.exists()]
    if missing:
        print(f"no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    for root in args.dirs:
        verdicts, skipped = compare_dir(args.promtool, root)
        every[str(root)] = [asdict(v) for v in verdicts]
        for v in verdicts:
            if v.agree:
                continue
            disagreements += 1
            if args.json:
                continue
            side = (
                "promtool accepts, gpuwatch refuses"
                if v.promtool_ok
                else ("gpuwatch loads, promtool refuses")
            )
            print(f"{v.file}: {side}")
            for line in (v.gpuwatch_errors if v.promtool_ok else v.promtool_errors)[:20]:
                print(f"    {line}")
        if not args.json:
            for name in skipped if args.verbose else []:
                print(f"{name}: skipped, no rule group (not YAML, empty, or other objects)")
            print(summary(root, verdicts, skipped))
    if args.json:
        json.dump(every, sys.stdout, indent=1)
        print()
    return 1 if disagreements else 0


if __name__ == "__main__":
    sys.exit(main())
