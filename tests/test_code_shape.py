"""The package's shape, read from the source: no module over 400 lines and no function over 60, so that every job has
a place a reader can hold at once (a long function is several jobs; a long module is several rooms)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "specdemo"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def long_modules() -> list[str]:
    return [f"{p.relative_to(PACKAGE.parent)}: {n} lines" for p in _files()
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]


def long_functions() -> list[str]:
    out = []
    for p in _files():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out.append(f"{p.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_module_over_400_lines():
    assert not long_modules(), "\n".join(long_modules())


def test_no_function_over_60_lines():
    assert not long_functions(), "\n".join(long_functions())


if __name__ == "__main__":
    print("\n".join(long_modules() + long_functions()) or "ok")
