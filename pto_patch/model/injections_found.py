"""Which pto-patch guards a source holds, read with the standard library's `ast`.

A guard is the statement pair every injection template starts with, at the top of a function
(after its docstring):

    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_<OP>", False):
        return pto_kernels.<entry>(...)

`status` and verify's check for other patchers only read guards, so they need neither libcst nor
its import time; the codemods ask `guard_switches` too, so a guard is recognised in one place.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

from pto_patch.model.spec import SWITCHES, ModelSpec

KERNEL_MODULE = "pto_kernels"


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _is_kernel_lookup(statement: ast.stmt) -> bool:
    """`pto_kernels = sys.modules.get(...)`."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return False
    call = statement.value
    return (
        _is_name(statement.targets[0], KERNEL_MODULE)
        and isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "get"
        and isinstance(call.func.value, ast.Attribute)
        and call.func.value.attr == "modules"
        and _is_name(call.func.value.value, "sys")
    )


def _preorder(node: ast.AST) -> Iterator[ast.AST]:
    yield node
    for child in ast.iter_child_nodes(node):
        yield from _preorder(child)


def _switch_read(test: ast.expr) -> str | None:
    """The switch of the first `getattr(pto_kernels, "SWITCH", ...)` in an `if` test, in source order."""
    for node in _preorder(test):
        if (
            isinstance(node, ast.Call)
            and _is_name(node.func, "getattr")
            and len(node.args) >= 2
            and _is_name(node.args[0], KERNEL_MODULE)
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            return node.args[1].value
    return None


def guard_switches(body: Sequence[ast.stmt]) -> list[str]:
    """Switch names of the guards at the top of a function body (after its docstring)."""
    statements = list(body)
    if statements and _is_docstring(statements[0]):
        statements = statements[1:]
    switches = []
    while len(statements) >= 2 and _is_kernel_lookup(statements[0]) and isinstance(statements[1], ast.If):
        switch = _switch_read(statements[1].test)
        if switch is None:
            break
        switches.append(switch)
        statements = statements[2:]
    return switches


def _guarded(statements: Sequence[ast.stmt], class_name: str | None) -> Iterator[tuple[str, str]]:
    """(switch, target) for the functions and methods among `statements`, through classes and
    compound statements; a function's own body is not entered (a guard sits at its top)."""
    for statement in statements:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
            target = class_name or statement.name
            for switch in guard_switches(statement.body):
                yield switch, target
        elif isinstance(statement, ast.ClassDef):
            yield from _guarded(statement.body, statement.name)
        else:  # if, for, while, with, try, match: their blocks, in source order
            for field in ("body", "handlers", "cases", "orelse", "finalbody"):
                for part in getattr(statement, field, ()):
                    nested = part.body if isinstance(part, ast.excepthandler | ast.match_case) else [part]
                    yield from _guarded(nested, class_name)


def find_injections(source: str, switches: dict[str, str] | None = None) -> dict[str, list[str]]:
    """{op: [target]} for every guard in `source`; a target is the class of a method or a function name.

    `switches` maps switch names to ops (default: `spec.SWITCHES`, every op); guards with other
    switches are left out.
    """
    switches = switches or {switch: op for op, switch in SWITCHES.items()}
    found: dict[str, list[str]] = {}
    for switch, target in _guarded(ast.parse(source).body, None):
        if switch in switches:
            found.setdefault(switches[switch], []).append(target)
    return found


def guarded_in_folder(folder: Path, spec: ModelSpec) -> dict[str, list[str]]:
    """{op: [target]} for every guard of the spec's ops in the folder's modeling file (the source a load
    imports: what carried guards when apply wrote it, so a forward replaced after the import still counts);
    none where the folder holds no such file or no source that parses (the load says why)."""
    try:
        source = (Path(folder) / spec.modeling_file).read_text(encoding="utf-8")
        return find_injections(source, {injection.switch: op for op, injection in spec.injections.items()})
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return {}
