"""The house's layering, read from the imports with `ast`: no circle, and no import back up.

From the top: `cli` > `tune` | `serving` > `run` > `hub` | `tiny` > `patching` > `model`. A package may import
its own modules, the packages below it, and the top-level modules (`errors`, `resources`, the face);
`tune` and `serving` stand side by side and import neither the other. The top-level modules import no
package. Inside `patching`, what the two writers share (`plan`) and what undoes a manifest (`put_back`,
`overlay_record`) sit below the writers. Inside `run`, by concern: `graph/` (compiling and capture) under
the core (`run/*.py`), and `ocr/` and `diagnosis/` above it, side by side: neither imports the other, and
the core imports neither.
`kernels/` (the pto_kernels the folder gets) imports nothing of pto_patch. Every import counts: at the
top of a module or inside a function.

Inside `kernels/pto_kernels/`, from the top: the package's face (`__init__`) > what picks, counts and
declares the backends (`_dispatch`, `ops`, `serving_ops`, `tuning`) > the backends (`backends/`: reference,
fused, npu, pypto) > the tile tables (`tiling/`). Imports run one way, down, and make no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Rank of each package, from the ground up; equal ranks may not import each other.
LAYERS = {"model": 0, "patching": 1, "hub": 2, "tiny": 2, "run": 3, "tune": 4, "serving": 4, "cli": 5}
TOP_LEVEL = {"pto_patch", "pto_patch.__main__", "pto_patch.errors", "pto_patch.resources"}
# Inside patching: these know only what a manifest recorded, never a writer.
PATCHING_FLOOR = ("plan", "put_back", "overlay_record", "manifest", "folder_kernels", "tuning_file")
PATCHING_WRITERS = ("engine", "overlay", "restore", "folder_status")
# Inside run, rank of each concern from the ground up; equal ranks may not import each other.
RUN_LAYERS = {"graph": 0, "core": 1, "ocr": 2, "diagnosis": 2}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, package: str = "pto_patch") -> dict[str, set[str]]:
    """Each module of `package` under `root` -> the modules of `package` it imports (`from a import b`
    counts as a.b where that is a module)."""
    modules = {module_name(root, path): path for path in (root / package).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                }
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def run_concern(module: str) -> str:
    """`ocr`, `graph` or `diagnosis` for a module of that subpackage of run; `core` for run's own."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[2] in RUN_LAYERS else "core"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import that runs up, sideways between two packages of one rank, or out of the top level."""
    found = []
    for module, targets in graph.items():
        for target in sorted(targets):
            here, there = layer_of(module), layer_of(target)
            if here is None and module in TOP_LEVEL and there is not None and module != "pto_patch.__main__":
                found.append(f"{module} -> {target}: the top level imports no package")
            elif here and there and here != there and LAYERS[there] >= LAYERS[here]:
                found.append(f"{module} -> {target}: {here} may not import {there}")
            elif here == there == "run":
                low, high = run_concern(module), run_concern(target)
                if low != high and RUN_LAYERS[high] >= RUN_LAYERS[low]:
                    found.append(f"{module} -> {target}: run's {low} may not import run's {high}")
            elif here == there == "patching":
                low, high = module.split(".")[2], target.split(".")[2]
                if low in PATCHING_FLOOR and high in PATCHING_WRITERS:
                    found.append(f"{module} -> {target}: what a writer shares may not import a writer")
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of more than one module (Tarjan)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def kernel_imports_of_pto_patch(kernels_root: Path) -> list[str]:
    found = []
    for path in sorted(kernels_root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.name} -> {name}" for name in names if name.split(".")[0] == "pto_patch"]
    return found


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def kernel_import_graph(root: Path, package: str = "pto_kernels") -> dict[str, set[str]]:
    """import_graph for the kernel package, whose modules import each other relatively (`from . import
    fused`, `from ..tiling.tile_table import TileConfig`)."""
    modules = {module_name(root, path): path for path in (root / package).rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = _package_of(name, path)
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                found |= {
                    f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names
                }
        graph[name] = {target for target in found if target in modules and target != name}
    return graph


# Rank of each part of the kernel package, from the ground up: an import may not reach a higher rank.
KERNEL_LAYERS = {"tiling": 0, "backends": 1, "picks": 2, "face": 3}


def kernel_layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "face"
    return parts[1] if parts[1] in ("tiling", "backends") else "picks"


def kernel_upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        for target in sorted(targets):
            here, there = kernel_layer(module), kernel_layer(target)
            if KERNEL_LAYERS[there] > KERNEL_LAYERS[here]:
                found.append(f"{module} -> {target}: {here} may not import {there}")
    return found


def test_kernels_import_one_way_down():
    assert kernel_upward_imports(kernel_import_graph(REPO / "kernels")) == []


def test_kernels_have_no_circle():
    graph = kernel_import_graph(REPO / "kernels")
    assert (
        "pto_kernels.backends.pypto_runtime" in graph["pto_kernels.backends.pypto_blocks"]
    )  # the graph sees
    assert circles(graph) == []


def test_no_import_runs_back_up():
    assert upward_imports(import_graph(REPO)) == []


def test_no_circle():
    assert circles(import_graph(REPO)) == []


def test_kernels_import_nothing_of_pto_patch():
    assert kernel_imports_of_pto_patch(REPO / "kernels") == []


def test_top_level_holds_the_face_main_errors_and_resources_only():
    top = {path.name for path in (REPO / "pto_patch").glob("*.py")}
    assert top == {"__init__.py", "__main__.py", "errors.py", "resources.py"}
    packages = {path.name for path in (REPO / "pto_patch").iterdir() if (path / "__init__.py").is_file()}
    assert packages == set(LAYERS)


# --- each check fails where it should ------------------------------------------------------------


def write(root: Path, relative: str, text: str = "") -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    for parent in path.relative_to(root).parents:
        if parent != Path(".") and not (root / parent / "__init__.py").exists():
            (root / parent / "__init__.py").write_text("", encoding="utf-8")


def fake_house(root: Path) -> None:
    for package in LAYERS:
        write(root, f"pto_patch/{package}/__init__.py")
    write(root, "pto_patch/errors.py")
    write(
        root, "pto_patch/cli/app.py", "from pto_patch.patching import engine\nfrom pto_patch import errors\n"
    )
    write(root, "pto_patch/patching/engine.py", "from pto_patch.patching.plan import plan_patch\n")
    write(root, "pto_patch/patching/plan.py", "from pto_patch.model.spec import ModelSpec\n")
    write(root, "pto_patch/patching/overlay.py", "")
    write(root, "pto_patch/model/spec.py", "from pto_patch.errors import SpecError\n")


def test_a_clean_fake_house_passes(tmp_path: Path):
    fake_house(tmp_path)
    graph = import_graph(tmp_path)
    assert upward_imports(graph) == [] and circles(graph) == []


@pytest.mark.parametrize(
    ("files", "reported"),
    [
        (  # an import up, even one inside a function
            {"pto_patch/patching/put_back.py": "def f():\n    from pto_patch.cli import app\n"},
            "pto_patch.patching.put_back -> pto_patch.cli.app: patching may not import cli",
        ),
        (  # sideways, between two packages of one rank
            {
                "pto_patch/tune/tuning.py": "from pto_patch.serving import vllm_plugin\n",
                "pto_patch/serving/vllm_plugin.py": "",
            },
            "pto_patch.tune.tuning -> pto_patch.serving.vllm_plugin: tune may not import serving",
        ),
        (  # the top level into a package
            {"pto_patch/errors.py": "from pto_patch.model import spec\n"},
            "pto_patch.errors -> pto_patch.model.spec: the top level imports no package",
        ),
        (  # put_back into a writer
            {"pto_patch/patching/put_back.py": "from pto_patch.patching.overlay import remove_links\n"},
            "pto_patch.patching.put_back -> pto_patch.patching.overlay: what a writer shares may not import a writer",
        ),
    ],
)
def test_each_wrong_import_is_reported(tmp_path: Path, files: dict[str, str], reported: str):
    fake_house(tmp_path)
    for relative, text in files.items():
        write(tmp_path, relative, text)
    assert upward_imports(import_graph(tmp_path)) == [reported]


def test_a_circle_is_reported(tmp_path: Path):
    fake_house(tmp_path)
    write(tmp_path, "pto_patch/patching/overlay.py", "from pto_patch.patching import engine\n")
    write(tmp_path, "pto_patch/patching/engine.py", "from pto_patch.patching import overlay\n")
    assert circles(import_graph(tmp_path)) == [["pto_patch.patching.engine", "pto_patch.patching.overlay"]]


def test_kernels_importing_pto_patch_is_reported(tmp_path: Path):
    write(tmp_path, "pto_kernels/ops.py", "import torch\nfrom pto_patch.model.spec import OPS\n")
    assert kernel_imports_of_pto_patch(tmp_path) == ["ops.py -> pto_patch.model.spec"]


def fake_kernels(root: Path) -> None:
    write(
        root, "pto_kernels/__init__.py", "from . import _dispatch, tuning\nfrom .backends import reference\n"
    )
    write(root, "pto_kernels/_dispatch.py", "import importlib\n")
    write(root, "pto_kernels/tuning.py", "from ._dispatch import OPS\n")
    write(root, "pto_kernels/backends/reference.py", "import torch\n")
    write(root, "pto_kernels/backends/fused.py", "from . import reference\n")
    write(root, "pto_kernels/backends/pypto_runtime.py", "from ..tiling.tile_table import TileConfig\n")
    write(root, "pto_kernels/tiling/tile_table.py", "")


def test_a_clean_fake_kernel_package_passes(tmp_path: Path):
    fake_kernels(tmp_path)
    graph = kernel_import_graph(tmp_path)
    assert graph["pto_kernels.backends.fused"] == {"pto_kernels.backends.reference"}
    assert graph["pto_kernels.backends.pypto_runtime"] == {"pto_kernels.tiling.tile_table"}
    assert kernel_upward_imports(graph) == [] and circles(graph) == []


@pytest.mark.parametrize(
    ("files", "reported"),
    [
        (  # a backend reaching the dispatcher that picks it
            {"pto_kernels/backends/fused.py": "def f():\n    from .._dispatch import ROUTES\n"},
            "pto_kernels.backends.fused -> pto_kernels._dispatch: backends may not import picks",
        ),
        (  # tuning reaching back up to the package's face
            {"pto_kernels/tuning.py": "def f():\n    from . import enable\n"},
            "pto_kernels.tuning -> pto_kernels: picks may not import face",
        ),
        (  # a tile table reaching a backend
            {"pto_kernels/tiling/tile_table.py": "from ..backends import fused\n"},
            "pto_kernels.tiling.tile_table -> pto_kernels.backends.fused: tiling may not import backends",
        ),
    ],
)
def test_each_kernel_import_up_is_reported(tmp_path: Path, files: dict[str, str], reported: str):
    fake_kernels(tmp_path)
    for relative, text in files.items():
        write(tmp_path, relative, text)
    assert kernel_upward_imports(kernel_import_graph(tmp_path)) == [reported]


def test_the_old_circle_between_the_pypto_modules_is_reported(tmp_path: Path):
    fake_kernels(tmp_path)
    write(tmp_path, "pto_kernels/backends/pypto_blocks.py", "from .pypto_ops import WEIGHT_LAYOUTS\n")
    write(
        tmp_path,
        "pto_kernels/backends/pypto_ops.py",
        "def __getattr__(name):\n    from . import pypto_blocks\n",
    )
    assert circles(kernel_import_graph(tmp_path)) == [
        ["pto_kernels.backends.pypto_blocks", "pto_kernels.backends.pypto_ops"]
    ]


def test_run_imports_by_concern_and_the_check_sees_a_sideways_import():
    graph = import_graph(REPO)
    assert "pto_patch.run.graph.compiling" in graph["pto_patch.run.bench"]  # the core over graph
    assert "pto_patch.run.bench" in graph["pto_patch.run.ocr.bench"]  # ocr over the core
    sideways = {"pto_patch.run.ocr.verify": {"pto_patch.run.diagnosis.doctor"}}
    down = {"pto_patch.run.graph.graph_decode": {"pto_patch.run.options"}}
    core_up = {"pto_patch.run.start": {"pto_patch.run.ocr.pages"}}
    for wrong in (sideways, down, core_up):
        assert len(upward_imports(wrong)) == 1, wrong
