"""The rooms of the package and who may import whom, read from the source (every import, module level or inside a
function): the engine knows no drafter, app or offline code; drafters know no app or offline code (offline work never
runs inside a request); only the page imports gradio; module-level imports form no cycle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "specdemo"
CORE = ("specdemo.engine", "specdemo.kvcache", "specdemo.tree", "specdemo.sampling", "specdemo.budget",
        "specdemo.target", "specdemo.cpu_linear", "specdemo.cpu_attention", "specdemo.step_decoder",
        "specdemo.calibration", "specdemo.precision", "specdemo.verify", "specdemo.static_step", "specdemo.cuda_graphs")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(every imported module, the ones imported at module level) of one file, as absolute names."""
    tree = ast.parse(path.read_text())
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    every, top = set(), set()
    top_level = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        every.update(names)
        if id(node) in top_level:
            top.update(names)
    return every, top


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def known(names: set[str]) -> set[str]:
    """Imported names that are modules of this package (from-imports of functions map to their module)."""
    return {n for n in names if n in MODULES}


@pytest.mark.parametrize("mod", CORE)
def test_core_imports_no_drafter_app_or_offline_code(mod):
    bad = {n for n in MODULES[mod][0] if n.startswith(("specdemo.drafters", "specdemo.app", "specdemo.offline"))}
    assert not bad, f"{mod} imports {sorted(bad)}"


def test_drafters_import_no_app_or_offline_code():
    for mod, (every, _) in MODULES.items():
        if mod.startswith("specdemo.drafters"):
            bad = {n for n in every if n.startswith(("specdemo.app", "specdemo.offline"))}
            assert not bad, f"{mod} imports {sorted(bad)}"


def test_only_the_page_imports_gradio():
    users = {mod for mod, (every, _) in MODULES.items() if any(n == "gradio" or n.startswith("gradio.") for n in every)}
    assert users and all(mod.startswith("specdemo.app.page") for mod in users), users


def test_no_app_module_imports_offline_code():
    """Offline work (corpora, training, datastore recipes) never runs inside a request: the app does not import it
    (app.py, the entry point, builds REST's default store before the server starts)."""
    bad = {mod: sorted(n for n in every if n.startswith("specdemo.offline"))
           for mod, (every, _) in MODULES.items() if mod.startswith("specdemo.app")}
    assert not {m: b for m, b in bad.items() if b}


def test_the_record_rendering_and_plots_load_without_torch_or_gradio():
    """What the page shows is plain data and HTML: the record, its rendering and the plots' frames import neither
    torch nor gradio (a fresh interpreter, so nothing else loaded them first)."""
    import subprocess
    import sys

    code = ("import sys, specdemo.app.record, specdemo.app.render, specdemo.app.plots, specdemo.metrics; "
            "print(sorted(m for m in ('torch', 'gradio') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"


def test_no_import_cycles_at_module_level():
    graph = {mod: known(top) - {mod} for mod, (_, top) in MODULES.items()}
    # a package's __init__ is imported before its submodules; a submodule importing its own package is no cycle
    graph = {mod: {d for d in deps if not mod.startswith(d + ".")} for mod, deps in graph.items()}
    state: dict[str, int] = {}

    def visit(mod: str, path: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(graph[mod]):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join(path + [mod, dep])
            if dep not in state:
                visit(dep, path + [mod])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [])


def test_the_walk_sees_the_imports_it_checks():
    """The checks above would pass vacuously if the walk missed imports: it must see the known ones."""
    assert "specdemo.engine" in known(MODULES["specdemo.drafters.pld"][1])
    assert "gradio" in MODULES["specdemo.app.page.layout"][1]
    assert "specdemo.offline.build_datastore" in known(MODULES["specdemo.offline.distill"][0])


def _imports_the_registry(source: str, me: str, is_package: bool = False) -> list[str]:
    """The statements of module `me` (its `source`) that import the drafter registry (`specdemo.drafters` itself):
    `import specdemo.drafters`, or `from specdemo.drafters import X` (also relative) where X is not a submodule."""
    registry = "specdemo.drafters"
    package = me if is_package else me.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name == registry]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base == registry:
                found += [f"from {base} import {a.name}" for a in node.names if f"{base}.{a.name}" not in MODULES]
    return found


def test_drafter_modules_import_the_contract_not_the_registry():
    """The registry imports drafter modules by name; a drafter importing it back would be a cycle the module-level
    graph above cannot see.  Drafters take what they share from specdemo.drafters.contract."""
    drafters = PACKAGE / "drafters"
    bad = {module_name(p): found for p in sorted(drafters.rglob("*.py")) if p != drafters / "__init__.py"
           and (found := _imports_the_registry(p.read_text(), module_name(p), p.name == "__init__.py"))}
    assert not bad, f"drafter modules importing the registry: {bad}"
    # the check sees such imports, and lets a drafter import a sibling submodule
    sneaky = "from specdemo.drafters import Option, pld\nfrom .. import knobs\nimport specdemo.drafters\n"
    assert _imports_the_registry(sneaky, "specdemo.drafters.rest.drafter") == [
        "from specdemo.drafters import Option", "from specdemo.drafters import knobs", "import specdemo.drafters"]
    assert not _imports_the_registry("from specdemo.drafters import contract\n", "specdemo.drafters.toy")
