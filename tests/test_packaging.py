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


# ZeroGPU runs one interpreter and a list of torch versions (Hugging Face hub docs, "Spaces ZeroGPU", Supported
# Versions); README's front matter asks for that interpreter, and requirements.txt pins a listed torch for it.
ZEROGPU_PYTHON = "3.10"
ZEROGPU_TORCH = {"2.1.0", "2.1.1", "2.1.2", "2.2.0", "2.2.2", "2.4.0", "2.5.1", "2.6.0", "2.7.1", "2.8.0"}
PYTHONS = (ZEROGPU_PYTHON, "3.11", "3.12", "3.13")


def pins(path: Path, python: str) -> dict[str, str]:
    """name -> version of the `name==version` lines of a requirements file (following -r includes) that apply on
    `python` (their environment markers evaluated for it); a name pinned twice for one interpreter fails."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            for name, version in pins(path.parent / line[3:].strip(), python).items():
                assert name not in out, f"{name} pinned twice for Python {python}"
                out[name] = version
        elif "==" in line:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"python_version": python}):
                continue
            name = re.sub(r"[-_.]+", "-", req.name.lower())
            assert name not in out, f"{name} pinned twice for Python {python}"
            out[name] = str(req.specifier).removeprefix("==")
    return out


@pytest.mark.parametrize("python", PYTHONS)
def test_every_dependency_range_admits_the_pinned_version(python):
    pinned = pins(ROOT / "requirements-dev.txt", python)
    deps = PROJECT["dependencies"] + PROJECT["optional-dependencies"]["dev"]
    for dep in map(Requirement, deps):
        name = re.sub(r"[-_.]+", "-", dep.name.lower())
        assert name in pinned, f"{dep.name} is a dependency but requirements*.txt pins no version of it for {python}"
        assert dep.specifier.contains(pinned[name], prereleases=True), f"{dep} excludes the pinned {pinned[name]}"
    assert {re.sub(r"[-_.]+", "-", Requirement(d).name.lower()) for d in deps} == set(pinned)
    assert PROJECT["requires-python"] and Requirement(f"x{PROJECT['requires-python']}").specifier.contains(python)


def test_the_space_declares_what_zerogpu_runs():
    front = (ROOT / "README.md").read_text().split("---")[1]
    assert re.search(rf'^python_version: "{ZEROGPU_PYTHON}"$', front, re.M), "README's front matter: ZeroGPU's Python"
    assert pins(ROOT / "requirements.txt", ZEROGPU_PYTHON)["torch"] in ZEROGPU_TORCH


def test_the_console_script_is_the_cli():
    module, _, func = PROJECT["scripts"]["specdemo"].partition(":")
    assert getattr(importlib.import_module(module), func) is importlib.import_module("specdemo.cli").main


def test_nothing_patches_sys_path():
    files = [*(ROOT / "specdemo").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), ROOT / "app.py"]
    bad = [str(f.relative_to(ROOT)) for f in files if re.search(r"sys\.path\.(insert|append)", f.read_text())]
    assert not bad, f"these patch sys.path instead of importing the installed package: {bad}"
