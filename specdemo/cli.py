"""`python -m specdemo <command>`: each command lives in its own module, which exposes `register(subparsers)`."""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = ("specdemo.bench", "specdemo.offline.calibrate", "specdemo.offline.build_datastore", "specdemo.offline.distill",
                   "specdemo.offline.train")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdemo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            importlib.import_module(name).register(sub)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # a real missing dependency, not a command that is not built yet
                raise
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
