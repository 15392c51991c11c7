"""Copy-on-write walks over libcst trees, for passes that change a few nodes of a large file.

libcst's `CSTTransformer` rebuilds every node it visits, changed or not, and dispatches a
`visit_` / `leave_` lookup per node: over a 6,000-line modeling file that is most of a pass's cost.
`copy_on_write` rebuilds only the nodes on the path to a change and returns the very same object
for every untouched subtree; `find_all` collects matching nodes without building anything. Both
skip the formatting-only fields (whitespace, commas, brackets, comments), which hold no names or
statements.

    renamed = copy_on_write(module, lambda node: rename(node) if isinstance(node, cst.Name) else None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import libcst as cst

# A rewrite returns the node's replacement (itself to keep it, without looking inside), or None to
# walk into its children.
Rewrite = Callable[[cst.CSTNode], "cst.CSTNode | None"]

# Fields that by libcst's design hold only formatting: whitespace, comments, punctuation, tokens.
FORMATTING_FIELDS = frozenset(
    {
        "lpar",
        "rpar",
        "lbracket",
        "rbracket",
        "lbrace",
        "rbrace",
        "comma",
        "semicolon",
        "colon",
        "dot",
        "equal",
        "operator",
        "newline",
        "header",
        "footer",
        "leading_lines",
        "lines_after_decorators",
        "trailing_whitespace",
        "asynchronous",
    }
)

_child_fields_cache: dict[type, tuple[str, ...]] = {}


def child_fields(node_type: type) -> tuple[str, ...]:
    """The fields of a libcst node type that may hold code (names, expressions, statements)."""
    fields = _child_fields_cache.get(node_type)
    if fields is None:
        fields = tuple(
            f.name
            for f in dataclasses.fields(node_type)
            if f.name not in FORMATTING_FIELDS and not f.name.startswith("whitespace")
        )
        _child_fields_cache[node_type] = fields
    return fields


def copy_on_write(node: cst.CSTNode, rewrite: Rewrite, skip: tuple[str, ...] = ()) -> cst.CSTNode:
    """`node` with `rewrite` applied top-down; untouched subtrees are returned as the same objects.

    `skip` names fields of `node` itself to leave as they are (a rewrite uses it to walk all of a
    node but, say, an attribute's name).
    """
    changes = {}
    for name in child_fields(type(node)):
        if name in skip:
            continue
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            new = _rewritten(value, rewrite)
            if new is not value:
                changes[name] = new
        elif isinstance(value, tuple | list) and value and isinstance(value[0], cst.CSTNode):
            items = [_rewritten(item, rewrite) for item in value]
            if any(new is not old for new, old in zip(items, value, strict=True)):
                changes[name] = type(value)(items)
    return node.with_changes(**changes) if changes else node


def _rewritten(node: cst.CSTNode, rewrite: Rewrite) -> cst.CSTNode:
    replaced = rewrite(node)
    return copy_on_write(node, rewrite) if replaced is None else replaced


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """`node` and every node below it that may hold code, depth first, in source order."""
    yield node
    for name in child_fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            yield from walk(value)
        elif isinstance(value, tuple | list):
            for item in value:
                if isinstance(item, cst.CSTNode):
                    yield from walk(item)


def find_all(node: cst.CSTNode, predicate: Callable[[cst.CSTNode], bool]) -> list[cst.CSTNode]:
    """Every node under (and including) `node` for which `predicate` holds, in source order."""
    return [found for found in walk(node) if predicate(found)]


def outer_statements(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The statements under `node` that lie outside every class and function body, in source order.

    Compound statements (`if`, `try`, ...) are yielded and entered; class and function definitions
    are yielded but not entered; a line's small statements (imports, assignments) are yielded one by
    one, without their line.
    """
    for name in child_fields(type(node)):
        value = getattr(node, name)
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, cst.SimpleStatementLine | cst.SimpleStatementSuite):
                yield from item.body
            elif isinstance(item, cst.ClassDef | cst.FunctionDef):
                yield item
            elif isinstance(item, cst.BaseCompoundStatement):
                yield item
                yield from outer_statements(item)
            elif isinstance(item, cst.CSTNode) and not isinstance(item, cst.BaseExpression):
                yield from outer_statements(item)  # a block, else, except, finally, with item, case
