"""`python -m specdemo train <method>`: each trainable drafter's module exposes `register_train(subparsers)`."""
from __future__ import annotations

import importlib

TRAINERS = ("specdemo.offline.train_s4c", "specdemo.offline.train_sdsat")


def register(sub) -> None:
    p = sub.add_parser("train", help="train a draft model (S4C heads, SDSAT adapter) for a target model")
    methods = p.add_subparsers(dest="method", required=True)
    for name in TRAINERS:
        try:
            importlib.import_module(name).register_train(methods)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
