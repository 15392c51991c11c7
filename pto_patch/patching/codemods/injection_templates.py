"""Loading the injected code from `templates/injections/*.py` and filling in its placeholders.

Templates are real Python modules. A guard template defines `guard(...)`; its body is what gets
injected, with its parameters bound by position to the target's parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import cast

import libcst as cst

from pto_patch.patching.codemods.guards import is_docstring
from pto_patch.resources import templates_dir

GUARD_FUNCTION = "guard"
SWITCH_PLACEHOLDER = "SWITCH"


@cache
def load_template(name: str) -> cst.Module:
    path = templates_dir() / "injections" / f"{name}.py"
    return cst.parse_module(path.read_text(encoding="utf-8"))


def template_body(name: str) -> tuple[cst.BaseStatement, ...]:
    """The template module's statements, without its docstring and imports."""
    statements = []
    for statement in load_template(name).body:
        if is_docstring(statement) or _is_import_line(statement):
            continue
        statements.append(statement)
    return tuple(statements)


def _is_import_line(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Import | cst.ImportFrom)
    )


def template_function(name: str, function: str = GUARD_FUNCTION) -> cst.FunctionDef:
    for statement in template_body(name):
        if isinstance(statement, cst.FunctionDef) and statement.name.value == function:
            return statement
    raise LookupError(f"template {name}.py defines no function {function}()")


class PlaceholderSubstituter(cst.CSTTransformer):
    """Replaces placeholder names by expressions and placeholder strings by string literals."""

    def __init__(self, names: Mapping[str, cst.BaseExpression], strings: Mapping[str, str]):
        super().__init__()
        self.names = dict(names)
        self.strings = dict(strings)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self.names.get(original_node.value, updated_node)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        # `x.NAME` is an attribute name, never a placeholder
        return updated_node.with_changes(attr=original_node.attr)

    def leave_SimpleString(
        self, original_node: cst.SimpleString, updated_node: cst.SimpleString
    ) -> cst.SimpleString:
        value = original_node.evaluated_value
        if value in self.strings:
            return updated_node.with_changes(value=f'"{self.strings[value]}"')
        return updated_node


def parameter_names(function: cst.FunctionDef) -> list[str]:
    params = function.params
    return [param.name.value for param in (*params.posonly_params, *params.params)]


def guard_statements(
    name: str,
    target_parameters: Sequence[str],
    switch: str,
    extra: Mapping[str, cst.BaseExpression] | None = None,
) -> tuple[cst.BaseStatement, ...]:
    """The guard template `name`'s body, bound to the target's parameters and switch.

    Raises ValueError when the target has fewer parameters than the template's guard.
    """
    guard = template_function(name)
    wanted = parameter_names(guard)
    if len(target_parameters) < len(wanted):
        raise ValueError(f"needs parameters ({', '.join(wanted)}), found ({', '.join(target_parameters)})")
    names: dict[str, cst.BaseExpression] = {
        placeholder: cst.Name(actual) for placeholder, actual in zip(wanted, target_parameters, strict=False)
    }
    names.update(extra or {})
    substituted = cast(
        cst.FunctionDef, guard.visit(PlaceholderSubstituter(names, {SWITCH_PLACEHOLDER: switch}))
    )
    return tuple(substituted.body.body)


def _fill_block(statements: Sequence[cst.BaseStatement], fills: Mapping[str, Sequence[cst.BaseStatement]]):
    """`statements` with each line holding only a placeholder name replaced by that placeholder's statements,
    in nested blocks too."""
    out: list[cst.BaseStatement] = []
    for statement in statements:
        if (
            isinstance(statement, cst.SimpleStatementLine)
            and len(statement.body) == 1
            and isinstance(statement.body[0], cst.Expr)
            and isinstance(statement.body[0].value, cst.Name)
            and statement.body[0].value.value in fills
        ):
            out.extend(fills[statement.body[0].value.value])
            continue
        if isinstance(statement, cst.If):
            statement = _fill_if(statement, fills)
        out.append(statement)
    return out


def _fill_if(statement: cst.If, fills: Mapping[str, Sequence[cst.BaseStatement]]) -> cst.If:
    body = statement.body.with_changes(body=_fill_block(statement.body.body, fills))
    orelse = statement.orelse
    if isinstance(orelse, cst.Else):
        orelse = orelse.with_changes(body=orelse.body.with_changes(body=_fill_block(orelse.body.body, fills)))
    elif isinstance(orelse, cst.If):
        orelse = _fill_if(orelse, fills)
    return statement.with_changes(body=body, orelse=orelse)


def template_piece(
    name: str,
    function: str,
    names: Mapping[str, cst.BaseExpression],
    statements: Mapping[str, Sequence[cst.BaseStatement]] | None = None,
    switch: str | None = None,
) -> tuple[cst.BaseStatement, ...]:
    """The body of `function` in template `name`, its placeholder names replaced by `names`, its placeholder
    lines by `statements`, and the string "SWITCH" by `switch`."""
    strings = {SWITCH_PLACEHOLDER: switch} if switch else {}
    substituted = cast(
        cst.FunctionDef, template_function(name, function).visit(PlaceholderSubstituter(names, strings))
    )
    fills = dict(statements or {})
    wrapped = fills.get("ORIGINAL")
    lead = wrapped[0].leading_lines if wrapped and isinstance(wrapped[0], cst.SimpleStatementLine) else ()
    if lead:  # the blank lines and comments that led the wrapped code now lead the piece
        fills["ORIGINAL"] = [wrapped[0].with_changes(leading_lines=()), *wrapped[1:]]
    piece = _fill_block(substituted.body.body, fills)
    if lead:
        piece[0] = piece[0].with_changes(leading_lines=lead)
    return tuple(piece)
