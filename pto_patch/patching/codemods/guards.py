"""Finding and placing pto-patch guards.

A guard is the statement pair every injection template starts with:

    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_<OP>", False):
        return pto_kernels.<entry>(...)

`has_guard` asks injections_found (the one reader of guards, on the standard library's `ast`)
whether a function holds one; the codemods use `insert_at_top` to place one.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from typing import cast

import libcst as cst

from pto_patch.model.injections_found import guard_switches


def is_docstring(statement: cst.CSTNode) -> bool:
    """A line holding only a string literal (plain or implicitly concatenated)."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, cst.SimpleString | cst.ConcatenatedString)
    )


def has_guard(function: cst.FunctionDef, switch: str) -> bool:
    if not isinstance(function.body, cst.IndentedBlock):
        return False
    parsed = cast(ast.FunctionDef, ast.parse(cst.Module(body=[function]).code).body[0])
    return switch in guard_switches(parsed.body)


def insert_at_top(function: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    """`function` with `statements` first in its body (after the docstring, which must stay first)."""
    body = cst.ensure_type(function.body, cst.IndentedBlock)
    existing = list(body.body)
    keep_first = 1 if existing and is_docstring(existing[0]) else 0
    new_body = [*existing[:keep_first], *statements, *existing[keep_first:]]
    return function.with_changes(body=body.with_changes(body=new_body))


def is_import_sys(statement: cst.CSTNode) -> bool:
    """A line holding only `import sys`."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return False
    small = statement.body[0]
    if not (isinstance(small, cst.Import) and len(small.names) == 1):
        return False
    alias = small.names[0]
    return isinstance(alias.name, cst.Name) and alias.name.value == "sys" and alias.asname is None


def is_future_import(statement: cst.CSTNode) -> bool:
    """A line holding only `from __future__ import ...`."""
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.ImportFrom)
        and isinstance(statement.body[0].module, cst.Name)
        and statement.body[0].module.value == "__future__"
    )


def with_import_sys(module: cst.Module) -> cst.Module:
    """`module` with a top-level `import sys` (the guards look the kernel package up in sys.modules),
    placed before its first import, after the docstring and `from __future__` imports."""
    body = list(module.body)
    if any(is_import_sys(statement) for statement in body):
        return module
    position = 0
    while position < len(body) and (is_docstring(body[position]) or is_future_import(body[position])):
        position += 1
    import_sys = cst.SimpleStatementLine(body=[cst.Import(names=[cst.ImportAlias(name=cst.Name("sys"))])])
    if position < len(body):
        # the new line takes over the blank lines and comments that led the statement it precedes
        following = body[position]
        import_sys = import_sys.with_changes(leading_lines=following.leading_lines)
        body[position] = following.with_changes(leading_lines=[])
    body.insert(position, import_sys)
    return module.with_changes(body=body)


GuardBuilder = Callable[[cst.FunctionDef], Sequence[cst.BaseStatement]]


class GuardInjector(cst.CSTTransformer):
    """Puts guards at the top of chosen functions.

    `builders` maps (class name, method name) for methods, or (None, function name) for
    module-level functions, to a callable returning the guard statements for that function.
    """

    def __init__(self, builders: dict[tuple[str | None, str], GuardBuilder]):
        super().__init__()
        self.builders = builders
        self.scopes: list[tuple[str, str]] = []
        self.injected: list[tuple[str | None, str]] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scopes.append(("class", node.name.value))

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.scopes.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append(("def", node.name.value))

    def leave_FunctionDef(
        self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
    ) -> cst.FunctionDef:
        self.scopes.pop()
        if not self.scopes:
            key: tuple[str | None, str] = (None, original_node.name.value)
        elif self.scopes[-1][0] == "class" and len(self.scopes) == 1:
            key = (self.scopes[-1][1], original_node.name.value)
        else:
            return updated_node
        builder = self.builders.get(key)
        if builder is None:
            return updated_node
        self.injected.append(key)
        return insert_at_top(updated_node, builder(original_node))

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return False

    def inject(self, module: cst.Module) -> cst.Module:
        """Visits only the module-level statements a builder names (a full traversal costs seconds)."""
        names = {class_name or function for class_name, function in self.builders}
        body = [
            statement.visit(self)
            if isinstance(statement, cst.ClassDef | cst.FunctionDef) and statement.name.value in names
            else statement
            for statement in module.body
        ]
        return module.with_changes(body=body)
