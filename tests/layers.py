"""The layer order of the apps and a static scanner of their imports.

Used by tests/test_layers.py (the apps) and tests/engine/test_engine_import_boundary.py
(the pure libraries). It reads the source with `ast`, so it sees imports that never
run: function-local ones and those under `if TYPE_CHECKING:`. docs/architecture.md
explains the order and the composition-root exemption.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Lowest first: an app may import only the apps before it in this tuple.
ORDER = (
    "controlplane",
    "tracing",
    "budgets",
    "approvals",
    "shop",
    "runs",
    "frontend",
)
RANK = {app: rank for rank, app in enumerate(ORDER)}

# Pure libraries any app may use; they import nothing from Django or the apps.
LIBRARIES = ("runs.engine", "runs.sandbox")
FRAMEWORKS = ("django", "celery", "rest_framework", "channels", "drf_spectacular")

# controlplane is also the project package: these files wire the apps together
# and may import any app (at module level, as every module does).
COMPOSITION_ROOT_FILES = frozenset(
    {
        "controlplane/urls.py",
        "controlplane/asgi.py",
        "controlplane/routing.py",
        "controlplane/celery.py",
        "controlplane/launcher.py",
        "controlplane/views.py",
    }
)
COMPOSITION_ROOT_PACKAGES = ("controlplane/settings/",)

CONTROLPLANE_MAX_LINES = 450


@dataclass(frozen=True)
class Import:
    file: str  # path relative to ROOT, with forward slashes
    line: int
    module: str  # absolute dotted name of the imported module
    local: bool  # inside a function body


def is_composition_root(file: str) -> bool:
    return file in COMPOSITION_ROOT_FILES or file.startswith(COMPOSITION_ROOT_PACKAGES)


def library_of(module: str) -> str | None:
    for library in LIBRARIES:
        if module == library or module.startswith(library + "."):
            return library
    return None


def app_of(module: str) -> str | None:
    """The app a module belongs to; None for a library or a non-project module."""
    top = module.split(".")[0]
    if top not in RANK or library_of(module):
        return None
    return top


def source_files(package: str, root: Path = ROOT) -> Iterator[Path]:
    """The package's Python files, migrations left out (they are frozen history)."""
    for path in sorted((root / package).rglob("*.py")):
        if "migrations" not in path.relative_to(root).parts:
            yield path


def _is_module(dotted: str, root: Path) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _absolute(node: ast.ImportFrom, file: str) -> str:
    if node.level == 0:
        return node.module or ""
    package = file.removesuffix(".py").split("/")[:-1]
    if node.level > 1:
        package = package[: -(node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import statement in the file, resolved to the modules it loads:
    `from runs import models` is runs.models, `from runs.models import Run` is
    runs.models, `from .models import X` is resolved against the file's package."""
    file = path.relative_to(root).as_posix()
    tree = ast.parse(path.read_text(), filename=file)
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(file, child.lineno, alias.name, local))
            elif isinstance(child, ast.ImportFrom):
                base = _absolute(child, file)
                for alias in child.names:
                    dotted = f"{base}.{alias.name}"
                    module = dotted if _is_module(dotted, root) else base
                    found.append(Import(file, child.lineno, module, local))
            visit(child, inner)

    visit(tree, False)
    return list(dict.fromkeys(found))


def layer_violations(root: Path = ROOT) -> dict[str, list[str]]:
    """What breaks the layer rules, keyed `file -> module` (or `file -> over N
    lines`), each with the places that break it:

    - an app imports a module of an app above it (module-level or function-local),
      except the composition root, which wires the apps together;
    - any module, the composition root too, imports another app's module inside
      a function (the way to dodge an import cycle);
    - a file of controlplane is over CONTROLPLANE_MAX_LINES lines.
    """
    found: dict[str, list[str]] = {}
    for app in ORDER:
        for path in source_files(app, root):
            file = path.relative_to(root).as_posix()
            if library_of(file.removesuffix(".py").replace("/", ".")):
                continue  # the libraries have their own test
            root_file = is_composition_root(file)
            for imp in imports_of(path, root):
                target = app_of(imp.module)
                if target is None or target == app:
                    continue
                why = []
                if RANK[target] > RANK[app] and not root_file:
                    why.append("imports an app above it")
                if imp.local:
                    why.append("function-local import of another app")
                if why:
                    key = f"{file} -> {imp.module}"
                    found.setdefault(key, []).append(
                        f"{file}:{imp.line}: {', '.join(why)}"
                    )
    for path in sorted((root / "controlplane").rglob("*.py")):
        file = path.relative_to(root).as_posix()
        lines = len(path.read_text().splitlines())
        if "migrations" not in path.parts and lines > CONTROLPLANE_MAX_LINES:
            found[f"{file} -> over {CONTROLPLANE_MAX_LINES} lines"] = [
                f"{file}: {lines} lines"
            ]
    return found


def library_violations(library: str, root: Path = ROOT) -> list[str]:
    """Imports that make a pure library depend on Django or on a project package
    other than itself (another library included)."""
    bad = []
    for path in source_files(library.replace(".", "/"), root):
        for imp in imports_of(path, root):
            top = imp.module.split(".")[0]
            own = library_of(imp.module) == library
            if top in FRAMEWORKS or (top in RANK and not own):
                bad.append(f"{imp.file}:{imp.line}: {imp.module}")
    return bad


def apps_on_disk(root: Path = ROOT) -> set[str]:
    """Top-level packages that are Django apps (they have an apps.py)."""
    return {path.parent.name for path in root.glob("*/apps.py")}
