"""Finding and placing pto-patch guards.

A guard is the statement pair every injection template starts with:

    pto_kernels = sys.modules.get("pto_kernels")
    if pto_kernels is not None and getattr(pto_kernels, "USE_PTO_<OP>", False):
        return pto_kernels.<entry>(...)

`GuardFinder` only collects facts (which functions hold a guard for which switch); the codemods
use `insert_at_top` to place one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import libcst as cst
import libcst.matchers as m

KERNEL_MODULE = "pto_kernels"

GUARD_LOOKUP = m.SimpleStatementLine(
    body=[
        m.Assign(
            targets=[m.AssignTarget(target=m.Name(KERNEL_MODULE))],
            value=m.Call(
                func=m.Attribute(
                    value=m.Attribute(value=m.Name("sys"), attr=m.Name("modules")), attr=m.Name("get")
                )
            ),
        )
    ]
)
GUARD_SWITCH_TEST = m.Call(
    func=m.Name("getattr"), args=[m.Arg(m.Name(KERNEL_MODULE)), m.Arg(m.SimpleString()), m.ZeroOrMore()]
)
DOCSTRING = m.SimpleStatementLine(body=[m.Expr(m.SimpleString() | m.ConcatenatedString())])


def guard_switches(body: Sequence[cst.BaseStatement]) -> list[str]:
    """Switch names of the guards at the top of a function body (after its docstring)."""
    statements = list(body)
    if statements and m.matches(statements[0], DOCSTRING):
        statements = statements[1:]
    switches = []
    while (
        len(statements) >= 2 and m.matches(statements[0], GUARD_LOOKUP) and isinstance(statements[1], cst.If)
    ):
        found = m.findall(statements[1].test, GUARD_SWITCH_TEST)
        if not found:
            break
        switch_literal = cst.ensure_type(found[0], cst.Call).args[1].value
        switches.append(str(cst.ensure_type(switch_literal, cst.SimpleString).evaluated_value))
        statements = statements[2:]
    return switches


class GuardFinder(cst.CSTVisitor):
    """Collects {switch: [target]} where target is `Class` for a method, `function` for a function."""

    def __init__(self) -> None:
        super().__init__()
        self.class_stack: list[str] = []
        self.found: dict[str, list[str]] = {}

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_stack.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.class_stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if isinstance(node.body, cst.IndentedBlock):
            target = self.class_stack[-1] if self.class_stack else node.name.value
            for switch in guard_switches(node.body.body):
                self.found.setdefault(switch, []).append(target)
        # guards sit at the top of a module-level function or a method; nothing inside can hold one
        return False

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
        return False


def has_guard(function: cst.FunctionDef, switch: str) -> bool:
    return isinstance(function.body, cst.IndentedBlock) and switch in guard_switches(function.body.body)


def insert_at_top(function: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    """`function` with `statements` first in its body (after the docstring, which must stay first)."""
    body = cst.ensure_type(function.body, cst.IndentedBlock)
    existing = list(body.body)
    keep_first = 1 if existing and m.matches(existing[0], DOCSTRING) else 0
    new_body = [*existing[:keep_first], *statements, *existing[keep_first:]]
    return function.with_changes(body=body.with_changes(body=new_body))


IMPORT_SYS = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("sys"), asname=None)])])
FUTURE_IMPORT = m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])


def with_import_sys(module: cst.Module) -> cst.Module:
    """`module` with a top-level `import sys` (the guards look the kernel package up in sys.modules),
    placed before its first import, after the docstring and `from __future__` imports."""
    body = list(module.body)
    if any(m.matches(statement, IMPORT_SYS) for statement in body):
        return module
    position = 0
    while position < len(body) and m.matches(body[position], DOCSTRING | FUTURE_IMPORT):
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
