"""The package is installable: pyproject's ranges admit requirements.txt's pins, its console script exists, and no
module or script patches sys.path (they import the installed package)."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def pins(path: Path) -> dict[str, str]:
    """name -> version of the `name==version` lines of a requirements file (following -r includes)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out.update(pins(path.parent / line[3:].strip()))
        elif "==" in line:
            name, version = line.split("==")
            out[re.sub(r"[-_.]+", "-", name.strip().lower())] = version.strip()
    return out


def test_every_dependency_range_admits_the_pinned_version():
    pinned = pins(ROOT / "requirements-dev.txt")
    deps = PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"]
    for dep in map(Requirement, deps):
        name = re.sub(r"[-_.]+", "-", dep.name.lower())
        assert name in pinned, f"{dep.name} is a dependency but requirements*.txt pins no version of it"
        assert dep.specifier.contains(pinned[name], prereleases=True), f"{dep} excludes the pinned {pinned[name]}"
    assert {re.sub(r"[-_.]+", "-", Requirement(d).name.lower()) for d in deps} == set(pinned)


def test_the_console_script_is_the_cli():
    module, _, func = PROJECT["scripts"]["specdemo"].partition(":")
    assert getattr(importlib.import_module(module), func) is importlib.import_module("specdemo.cli").main


def test_nothing_patches_sys_path():
    files = [*(ROOT / "specdemo").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), ROOT / "app.py"]
    bad = [str(f.relative_to(ROOT)) for f in files if re.search(r"sys\.path\.(insert|append)", f.read_text())]
    assert not bad, f"these patch sys.path instead of importing the installed package: {bad}"
