"""`gpuwatch gpu history` and `gpuwatch gpu rma`: a GPU's life record, read from the state
directory's `life.db` (read-only), so they answer with the daemon stopped too, as it often is
when a GPU is about to be pulled."""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from pathlib import Path

from gpuwatch.clients.exits import EXIT_CONFIG, fail
from gpuwatch.life.book import FILE_NAME, LifeBook, read_entries, read_gpus
from gpuwatch.life.history import find, gpu_table, history_json, history_text
from gpuwatch.life.rma import SUMMARY, write_bundle
from gpuwatch.state.paths import default_state_dir
from gpuwatch.text.printable import printable

EXIT_NOT_FOUND = 1


def cmd_gpu(args: argparse.Namespace) -> int:
    path = Path(args.state_dir or default_state_dir()) / FILE_NAME
    try:
        db = LifeBook.reader(path)
    except (OSError, sqlite3.Error) as exc:
        return fail(str(exc))
    try:
        return _run(args, db)
    except sqlite3.Error as exc:
        return fail(f"{path}: {exc}")
    finally:
        db.close()


def _run(args: argparse.Namespace, db: sqlite3.Connection) -> int:
    if args.gpu_command == "history" and not args.serial:
        lives = read_gpus(db)
        if args.json:
            print(json.dumps([history_json(g, []) for g in lives.values()], indent=2))
        else:
            print("\n".join(gpu_table(lives)) if lives else "no GPU recorded yet")
        return 0
    found = find(db, args.serial)
    if len(found) != 1:
        known = printable(", ".join(read_gpus(db))) or "none"
        if found:  # a board with several GPUs: which one
            uuids = ", ".join(str(g.known.get("uuid")) for g in found)
            said = printable(
                f"board {args.serial} holds {len(found)} GPUs: name one by UUID: {uuids}"
            )
            return fail(said)
        wanted = printable(repr(args.serial))
        return fail(f"no GPU with serial or UUID {wanted}; known: {known}", EXIT_NOT_FOUND)
    [life] = found
    entries = read_entries(db, life.serial)
    if args.gpu_command == "history":
        if args.json:
            print(json.dumps(history_json(life, entries), indent=2))
        else:
            sys.stdout.write(history_text(life, entries))
        return 0
    try:
        folder = write_bundle(life, entries, Path(args.output), time.time())
    except OSError as exc:
        return fail(f"cannot write the RMA bundle under {args.output}: {exc}", EXIT_CONFIG)
    print(f"wrote {folder}/")
    print(f"next: add nvidia-bug-report.sh's output, as {folder / SUMMARY} says at its end")
    return 0
