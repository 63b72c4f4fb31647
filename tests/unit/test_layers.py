"""The layering, enforced strictly: a module imports only from its own package or from the layers
below it; two packages of one layer never import each other.

    cli                      the command line: parses, dispatches to a frontend, renders
    tui | web | ray          the other frontends (`top`, `web`, the Ray warden actors): act through control
    text                     text of the views that every frontend shares (tables, reports)
    control                  what a user asks for: views of jobs, run, stop, adopt, dump, orphans
    shim                     the per-job supervising loop and its services (notify, GPUs, the watchers)
    verdict                  a run's verdict read back from its records; the hang watchdog's signs
    probes | store | rules | hooks   observe | persist | judge | the code injected into jobs
    osapi                    the only code that forks, execs, signals, waits
    joboptions | progress    the typed options of a job; progress parsed from output and hooks (pure)
    config | clock | paths | trace   settings, an injectable clock, file locations, -v output
    model | observations | errors   plain data (core, diagnosis evidence), exceptions: stdlib only

Every import counts, including the lazy ones inside functions and those under `if TYPE_CHECKING:`.
Beyond the layers, the frontends (cli, tui, web, ray) never reach the store: they act through control,
which opens it, reads or writes, and closes it before handing back plain records. Nothing above the
shim imports it but the one module that launches it (control.shimproc): what the views read of a run
(its verdict, the watchdog's signs, a GPU request) lies below both.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import jobwarden

SRC = Path(jobwarden.__file__).resolve().parent

# Bottom to top. Packages of one layer are peers: neither may import the other.
LAYERS: list[set[str]] = [
    {"model", "observations", "errors"},
    {"config", "clock", "paths", "trace"},
    {"joboptions", "progress"},
    {"osapi"},
    {"probes", "store", "rules", "hooks"},
    {"verdict"},
    {"shim"},
    {"control"},
    {"text"},
    {"tui", "web", "ray"},
    {"cli"},
]
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}
EXEMPT = {"jobwarden", "jobwarden.__main__"}  # the package root and the `python -m` entry point
FRONTENDS = {"cli", "tui", "web", "ray"}
BEHIND_CONTROL = {"store"}  # what a frontend reaches only through control, though it lies below
STDLIB_ONLY = {"jobwarden.model", "jobwarden.observations", "jobwarden.errors"}
SHIM_LAUNCHERS = {"jobwarden.control.shimproc"}  # forks the shim: the only module above it to import it


def module_name(path: Path) -> str:
    parts = ["jobwarden", *path.relative_to(SRC).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def component(module: str) -> str:
    """'jobwarden.store.db' -> 'store'; 'jobwarden.config' -> 'config'; 'jobwarden' -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(source: str, module: str, is_package: bool = False) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import anywhere in `source`, relative ones resolved.
    `from jobwarden import config` names the submodule jobwarden.config; `from jobwarden import
    __version__` names the package root."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if _is_module(sub) else target


def _is_module(name: str) -> bool:
    if not name.startswith("jobwarden."):
        return False
    rel = Path(*name.split(".")[1:])
    return (SRC / rel).with_suffix(".py").is_file() or (SRC / rel / "__init__.py").is_file()


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """Imports of `module` that reach up the layers, or into a package no layer names."""
    found = []
    here = RANK.get(component(module))
    for line, target in imports_of(source, module, is_package):
        if target != "jobwarden" and not target.startswith("jobwarden."):
            continue
        there = component(target)
        if target == "jobwarden":
            continue  # the root holds only __version__ and imports nothing (checked below)
        if there not in RANK:
            found.append(f"{module}:{line} imports {target}, which is in no layer")
        elif here is not None and RANK[there] > here:
            found.append(
                f"{module}:{line} imports {target} from a higher layer ({there} above {component(module)})"
            )
        elif here is not None and RANK[there] == here and there != component(module):
            found.append(f"{module}:{line} imports {target} from a peer of its layer ({there})")
        elif component(module) in FRONTENDS and there in BEHIND_CONTROL:
            found.append(
                f"{module}:{line} imports {target}: a frontend acts through control, never the {there}"
            )
        elif there == "shim" and here is not None and here > RANK["shim"] and module not in SHIM_LAUNCHERS:
            found.append(
                f"{module}:{line} imports {target}: only {', '.join(sorted(SHIM_LAUNCHERS))} reaches the shim"
            )
    return found


# --- the code as it is ----------------------------------------------------------------------------


def test_the_source_tree_is_found() -> None:
    modules = all_modules()
    assert "jobwarden.store.repo" in modules
    assert "jobwarden.cli.main" in modules
    assert len(modules) > 20


def test_every_module_belongs_to_a_layer() -> None:
    unplaced = [m for m in all_modules() if m not in EXEMPT and component(m) not in RANK]
    assert unplaced == [], "add new packages to LAYERS (and to STYLE.md)"


@pytest.mark.parametrize("module", sorted(set(all_modules()) - EXEMPT))
def test_imports_go_down_the_layers(module: str) -> None:
    path = all_modules()[module]
    assert violations(module, path.read_text(), is_package=path.name == "__init__.py") == []


@pytest.mark.parametrize("module", sorted(STDLIB_ONLY))
def test_model_and_errors_import_only_the_stdlib(module: str) -> None:
    path = all_modules()[module]
    imported = {target.split(".")[0] for _, target in imports_of(path.read_text(), module)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_package_root_imports_nothing_of_jobwarden() -> None:
    # Everything may read jobwarden.__version__, so the root must not pull in any layer.
    source = (SRC / "__init__.py").read_text()
    assert [t for _, t in imports_of(source, "jobwarden", is_package=True) if t.startswith("jobwarden")] == []


def test_the_shipped_package_never_imports_the_tests_tools() -> None:
    """The fakes (tests/fakeos.py, fake clocks) stay out of what users install: no module reaches them."""
    reached = [
        f"{module} imports {target}"
        for module, path in all_modules().items()
        for _, target in imports_of(path.read_text(), module, is_package=path.name == "__init__.py")
        if target == "tests" or target.startswith("tests.")
    ]
    assert reached == []
    assert not (SRC / "shim" / "fakeos.py").exists()


# --- the checker itself: it must catch what it is for -----------------------------------------------


def test_the_checker_catches_an_import_from_above() -> None:
    assert violations("jobwarden.osapi.procfs", "from jobwarden.store import Store\n") == [
        "jobwarden.osapi.procfs:1 imports jobwarden.store from a higher layer (store above osapi)"
    ]


def test_the_checker_catches_a_lazy_import_inside_a_function() -> None:
    source = "def f():\n    if True:\n        import jobwarden.cli.main\n"
    assert len(violations("jobwarden.rules.death", source)) == 1


def test_the_checker_catches_a_submodule_imported_from_the_root() -> None:
    assert len(violations("jobwarden.model", "from jobwarden import config\n")) == 1


def test_the_checker_resolves_relative_imports() -> None:
    assert len(violations("jobwarden.store.repo", "from ..control import views\n")) == 1
    assert violations("jobwarden.store.repo", "from .db import connect\n") == []
    assert len(violations("jobwarden.store", "from ..shim import tree\n", is_package=True)) == 1


def test_the_checker_allows_its_own_package_and_below() -> None:
    source = (
        "from jobwarden.verdict.explainer import findings_for\nfrom jobwarden.store import Store\nimport os\n"
    )
    assert violations("jobwarden.control.views.joblist", source) == []
    sibling = "from jobwarden.control.views.jobstatus import job_status\n"
    assert violations("jobwarden.control.views.joblist", sibling) == []


def test_the_checker_catches_a_peer_of_the_same_layer() -> None:
    # a rule is a pure function: it never reads the store, though both sit one layer above osapi
    assert violations("jobwarden.rules.death", "from jobwarden.store import Store\n") == [
        "jobwarden.rules.death:1 imports jobwarden.store from a peer of its layer (store)"
    ]
    assert len(violations("jobwarden.web.api", "from jobwarden.tui import data\n")) == 1


def test_the_shim_never_imports_control() -> None:
    source = "from jobwarden.control.views.joblist import refresh\n"
    assert len(violations("jobwarden.shim.run.attempts", source)) == 1


def test_above_the_shim_only_its_launcher_imports_it() -> None:
    """control reads a run's verdict, the watchdog's signs and a GPU request from below the shim; only
    control.shimproc, which forks the shim and calls its entry point, imports it."""
    source = "from jobwarden.shim.run.attempts import log\n"
    assert violations("jobwarden.control.views.jobstatus", source) == [
        "jobwarden.control.views.jobstatus:1 imports jobwarden.shim.run.attempts:"
        " only jobwarden.control.shimproc reaches the shim"
    ]
    lazy = "def f():\n    from jobwarden.shim.watch.watchdog import ProgressTracker\n"
    assert len(violations("jobwarden.control.health", lazy)) == 1
    assert len(violations("jobwarden.web.api", "import jobwarden.shim.record.notify\n")) == 1
    assert (
        violations("jobwarden.control.shimproc", "from jobwarden.shim.run.attempts import supervise_job\n")
        == []
    )
    assert violations("jobwarden.shim.run.watching", "from jobwarden.shim.tree.jobtree import Member\n") == []


def test_a_frontend_never_reaches_the_store() -> None:
    assert violations("jobwarden.web.api", "from jobwarden.store import Store\n") == [
        "jobwarden.web.api:1 imports jobwarden.store: a frontend acts through control, never the store"
    ]
    lazy = "def f():\n    from jobwarden.store.logfiles import follow\n"
    assert len(violations("jobwarden.cli.commands.logs", lazy)) == 1
    typing_only = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jobwarden.store import RunRecord\n"
    )
    assert len(violations("jobwarden.cli.launched", typing_only)) == 1
    assert len(violations("jobwarden.tui.data", "import jobwarden.store.repo\n")) == 1
    assert len(violations("jobwarden.ray.warden", "from ..store import Store\n")) == 1
    # control itself, and a frontend's other imports from below, are as before
    assert violations("jobwarden.control.jobs", "from jobwarden.store import Store\n") == []
    assert violations("jobwarden.cli.common", "from jobwarden.control.jobs import find_job\n") == []


def test_the_checker_flags_an_unknown_package() -> None:
    assert len(violations("jobwarden.cli.main", "import jobwarden.plugins.x\n")) == 1


# --- no import cycles ---------------------------------------------------------------------------------


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the modules of `sources` it imports (lazy imports and TYPE_CHECKING ones count too)."""
    return {
        module: {t for _, t in imports_of(source, module, is_package) if t in sources and t != module}
        for module, (source, is_package) in sources.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted: every cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others() -> None:
    """A cycle (the CLI's parser -> handlers -> completion -> parser was one) makes the import order
    matter and every module of it one to understand at once; the registry loads a command by its name."""
    sources = {m: (p.read_text(), p.name == "__init__.py") for m, p in all_modules().items()}
    assert cycles(import_graph(sources)) == []


def test_the_cycle_checker_finds_a_cycle_through_a_lazy_import() -> None:
    sources = {
        "jobwarden.cli.a": ("from jobwarden.cli.b import x\n", False),
        "jobwarden.cli.b": ("def f():\n    from jobwarden.cli.c import y\n", False),
        "jobwarden.cli.c": ("import jobwarden.cli.a\n", False),
        "jobwarden.cli.d": ("import jobwarden.cli.a\n", False),
    }
    assert cycles(import_graph(sources)) == [["jobwarden.cli.a", "jobwarden.cli.b", "jobwarden.cli.c"]]
