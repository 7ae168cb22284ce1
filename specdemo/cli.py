"""`python -m specdemo <command>` (or `specdemo <command>` once the package is installed): each command lives in its
own module, which exposes `register(subparsers)`."""
from __future__ import annotations

import argparse
import sys

from specdemo import acceptance, bench
from specdemo.offline import build_datastore, calibrate, distill, train

COMMANDS = (bench, acceptance, calibrate, build_datastore, distill, train)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdemo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS:
        module.register(sub)
    args = parser.parse_args(argv)
    args.command_line = "python -m specdemo " + " ".join(sys.argv[1:] if argv is None else argv)  # recorded in outputs
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
