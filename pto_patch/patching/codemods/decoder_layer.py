"""Finding a decoder layer's parts in the modeling source, for the block injections (analysis only).

The blocks span two methods: the decoder layer's `forward` decides and the attention's `forward`
follows. Every anchor is structural, found by the shape of the statements, not by line or comment:

- the attention call: the statement unpacking `self.<attn>(...)` into a tuple (`hidden_states, _ = ...`);
  the attention class is what `__init__` assigns to `self.<attn>`;
- the input norm: `x = self.<norm>(x)` before the attention call;
- the post-attention run: `x = residual + x`, `residual = x`, `x = self.<norm>(x)`, `x = self.<mlp>(x)`,
  `x = residual + x`, in a row after the attention call;
- in the attention's forward: the first statement calling `self.q_proj`, through the statement that
  assigns the rotary function's result (the prologue), and `x = self.o_proj(x)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from pto_patch.errors import AnchorNotFoundError
from pto_patch.patching.codemods.guards import is_docstring
from pto_patch.patching.codemods.injection_templates import parameter_names
from pto_patch.patching.codemods.node_walk import find_all


def module_class(module: cst.Module, name: str) -> cst.ClassDef | None:
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == name:
            return statement
    return None


def method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    for item in cls.body.body:
        if isinstance(item, cst.FunctionDef) and item.name.value == name:
            return item
    return None


def replace_method(module: cst.Module, class_name: str, new: cst.FunctionDef) -> cst.Module:
    body = []
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == class_name:
            items = [
                new if isinstance(i, cst.FunctionDef) and i.name.value == new.name.value else i
                for i in statement.body.body
            ]
            statement = statement.with_changes(body=statement.body.with_changes(body=items))
        body.append(statement)
    return module.with_changes(body=body)


def self_attribute(node: cst.BaseExpression) -> str | None:
    """`self.x` -> "x"."""
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return node.attr.value
    return None


def single_assign(statement: cst.CSTNode) -> cst.Assign | None:
    if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1:
        small = statement.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            return small
    return None


def target_names(assign: cst.Assign) -> tuple[str, ...]:
    target = assign.targets[0].target
    if isinstance(target, cst.Name):
        return (target.value,)
    if isinstance(target, cst.Tuple):
        return tuple(e.value.value for e in target.elements if isinstance(e.value, cst.Name))
    return ()


def self_call(assign: cst.Assign | None) -> str | None:
    """`... = self.x(...)` -> "x"."""
    if assign is not None and isinstance(assign.value, cst.Call):
        return self_attribute(assign.value.func)
    return None


def is_name(node: cst.BaseExpression, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def is_residual_add(statement: cst.CSTNode, hidden: str, residual: str) -> bool:
    """`hidden = residual + hidden`."""
    assign = single_assign(statement)
    return (
        assign is not None
        and target_names(assign) == (hidden,)
        and isinstance(assign.value, cst.BinaryOperation)
        and isinstance(assign.value.operator, cst.Add)
        and is_name(assign.value.left, residual)
        and is_name(assign.value.right, hidden)
    )


def is_copy(statement: cst.CSTNode, target: str, source: str) -> bool:
    """`target = source`."""
    assign = single_assign(statement)
    return assign is not None and target_names(assign) == (target,) and is_name(assign.value, source)


def is_module_call(statement: cst.CSTNode, hidden: str) -> str | None:
    """`hidden = self.x(hidden)` -> "x"."""
    assign = single_assign(statement)
    if assign is None or target_names(assign) != (hidden,) or not isinstance(assign.value, cst.Call):
        return None
    args = assign.value.args
    if len(args) == 1 and args[0].keyword is None and is_name(args[0].value, hidden):
        return self_attribute(assign.value.func)
    return None


def body_statements(function: cst.FunctionDef) -> list[cst.BaseStatement]:
    return list(cst.ensure_type(function.body, cst.IndentedBlock).body)


def with_body(function: cst.FunctionDef, statements: Sequence[cst.BaseStatement]) -> cst.FunctionDef:
    return function.with_changes(body=function.body.with_changes(body=list(statements)))


def star_kwargs(function: cst.FunctionDef) -> str | None:
    star = function.params.star_kwarg
    return star.name.value if star is not None else None


@dataclass(frozen=True)
class DecoderLayer:
    """Where a decoder layer's pieces are, by name and by statement index in its forward's body."""

    class_name: str
    forward: cst.FunctionDef
    kwargs: str  # the forward's **kwargs name
    hidden: str  # the hidden-states variable
    residual: str
    attention_attr: str  # self.<attention_attr>(...)
    attention_class: str
    attention_call: int  # index of the attention call statement
    input_norm: int | None  # index of `hidden = self.<input norm>(hidden)`
    input_norm_attr: str | None
    post_run: int | None  # index of the five-statement post-attention run
    post_norm_attr: str | None
    mlp_attr: str | None


def _attention_call(statements: Sequence[cst.BaseStatement]) -> tuple[int, str, str] | None:
    """(index, attribute, hidden-states name) of `hidden, _ = self.<attn>(...)`."""
    for index, statement in enumerate(statements):
        assign = single_assign(statement)
        attr = self_call(assign)
        if attr is None or not isinstance(assign.targets[0].target, cst.Tuple):
            continue
        names = target_names(assign)
        if names:
            return index, attr, names[0]
    return None


def _constructed_class(init: cst.FunctionDef | None, attr: str) -> str | None:
    """The class `__init__` assigns to self.<attr> (`self.<attr> = SomeClass(...)`)."""
    for statement in body_statements(init) if init is not None else ():
        assign = single_assign(statement)
        if assign is None or not isinstance(assign.value, cst.Call):
            continue
        target = assign.targets[0].target
        if self_attribute(target) == attr and isinstance(assign.value.func, cst.Name):
            return assign.value.func.value
    return None


def find_decoder_layer(module: cst.Module, class_names: Sequence[str], where: str, op: str) -> DecoderLayer:
    for name in class_names:
        cls = module_class(module, name)
        forward = method(cls, "forward") if cls is not None else None
        if forward is not None:
            break
    else:
        raise AnchorNotFoundError(
            f"no decoder layer class with a forward ({', '.join(class_names)}) in {where}",
            f"this release renamed the decoder layer; add its name to the spec's {op} classes",
        )
    statements = body_statements(forward)
    kwargs = star_kwargs(forward)
    found = _attention_call(statements)
    attention_class = _constructed_class(method(cls, "__init__"), found[1]) if found else None
    if kwargs is None or found is None or attention_class is None:
        raise AnchorNotFoundError(
            f"{name}.forward in {where} has no `hidden, _ = self.<attention>(...)` call with **kwargs "
            "and an attention class built in __init__",
            f"this release changed the decoder layer; the {op} injection cannot place its block",
        )
    index, attention_attr, hidden = found
    input_norm = input_norm_attr = None
    for position in range(index - 1, -1, -1):
        attr = is_module_call(statements[position], hidden)
        if attr is not None:
            input_norm, input_norm_attr = position, attr
            break
    residual = next(
        (target_names(single_assign(s))[0] for s in statements[:index] if _copies_hidden(s, hidden)),
        "residual",
    )
    post_run = post_norm_attr = mlp_attr = None
    for position in range(index + 1, len(statements) - 4):
        run = statements[position : position + 5]
        norm, mlp = is_module_call(run[2], hidden), is_module_call(run[3], hidden)
        if (
            is_residual_add(run[0], hidden, residual)
            and is_copy(run[1], residual, hidden)
            and norm is not None
            and mlp is not None
            and is_residual_add(run[4], hidden, residual)
        ):
            post_run, post_norm_attr, mlp_attr = position, norm, mlp
            break
    return DecoderLayer(
        class_name=name,
        forward=forward,
        kwargs=kwargs,
        hidden=hidden,
        residual=residual,
        attention_attr=attention_attr,
        attention_class=attention_class,
        attention_call=index,
        input_norm=input_norm,
        input_norm_attr=input_norm_attr,
        post_run=post_run,
        post_norm_attr=post_norm_attr,
        mlp_attr=mlp_attr,
    )


def _copies_hidden(statement: cst.CSTNode, hidden: str) -> bool:
    assign = single_assign(statement)
    return assign is not None and is_name(assign.value, hidden) and len(target_names(assign)) == 1


@dataclass(frozen=True)
class Prologue:
    """The statements of an attention's forward from its first projection through its rotary call."""

    forward: cst.FunctionDef
    kwargs: str
    hidden: str  # the argument of self.q_proj(...)
    first_projection: int  # index of the first statement calling self.q_proj / k_proj / v_proj
    rotary: int  # index of `q, k = <rotary>(q, k, cos, sin, ...)`
    rotary_call: cst.Call
    qkv: tuple[str, str, str]  # the names q, k and v end up in


def _calls_self(node: cst.CSTNode, attr: str) -> cst.Call | None:
    """The first call of self.<attr>(...) inside `node` (a statement line)."""
    found = find_all(node, lambda n: isinstance(n, cst.Call) and self_attribute(n.func) == attr)
    return found[0] if found else None


def assigned_names(statement: cst.CSTNode) -> tuple[str, ...]:
    assign = single_assign(statement)
    return target_names(assign) if assign is not None else ()


def attention_forward(
    module: cst.Module, class_name: str, where: str, op: str
) -> tuple[cst.FunctionDef, str]:
    cls = module_class(module, class_name)
    forward = method(cls, "forward") if cls is not None else None
    kwargs = star_kwargs(forward) if forward is not None else None
    if forward is None or kwargs is None:
        raise AnchorNotFoundError(
            f"the attention class {class_name} in {where} has no forward taking **kwargs",
            f"this release changed the attention; the {op} injection cannot reach it",
        )
    return forward, kwargs


def find_prologue(
    module: cst.Module, class_name: str, rotary_functions: Sequence[str], where: str, op: str
) -> Prologue:
    forward, kwargs = attention_forward(module, class_name, where, op)
    first = hidden = rotary = call = None
    names: dict[str, str] = {}
    for index, statement in enumerate(body_statements(forward)):
        assign = single_assign(statement)
        if assign is None:
            continue
        for proj, role in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
            projection = _calls_self(statement, proj)
            if projection is not None:
                if first is None:
                    first = index
                    hidden = projection.args[0].value.value if is_name_arg(projection) else None
                names[role] = target_names(assign)[0]
        value = assign.value
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value in rotary_functions
            and len(target_names(assign)) == 2
        ):
            rotary, call = index, value
            names["q"], names["k"] = target_names(assign)
    if first is None or hidden is None or rotary is None or call is None or len(names) != 3 or rotary < first:
        raise AnchorNotFoundError(
            f"{class_name}.forward in {where} has no q/k/v projections of one tensor followed by a call of "
            f"{' / '.join(rotary_functions)}",
            f"this release changed the attention; the {op} injection cannot place its prologue",
        )
    return Prologue(forward, kwargs, hidden, first, rotary, call, (names["q"], names["k"], names["v"]))


@dataclass(frozen=True)
class CacheUpdate:
    """`if <cache> is not None: ... k, v = <cache>.update(k, v, self.layer_idx, ...)` right after a rotary call."""

    index: int  # of the `if` statement in the forward's body
    cache: str  # the cache's name (past_key_values, cache)
    position: str | None  # the forward's `cache_position` parameter where it has one (transformers <= 5.0)


def find_cache_update(forward: cst.FunctionDef, index: int, qkv: tuple[str, str, str]) -> CacheUpdate | None:
    """The KV-cache update at statement `index` of the attention's forward, updating q/k/v's k and v; None
    when that statement is anything else (the prologue then leaves the update to run as written)."""
    statements = body_statements(forward)
    if index >= len(statements) or not isinstance(statements[index], cst.If):
        return None
    test = statements[index].test
    if not (
        isinstance(test, cst.Comparison)
        and isinstance(test.left, cst.Name)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.IsNot)
        and is_name(test.comparisons[0].comparator, "None")
    ):
        return None
    cache, (_, k, v) = test.left.value, qkv
    for statement in statements[index].body.body:
        assign = single_assign(statement)
        call = assign.value if assign is not None else None
        positional = (
            [arg.value for arg in call.args if arg.keyword is None] if isinstance(call, cst.Call) else []
        )
        if (
            isinstance(call, cst.Call)
            and isinstance(call.func, cst.Attribute)
            and is_name(call.func.value, cache)
            and call.func.attr.value == "update"
            and target_names(assign) == (k, v)
            and len(positional) >= 3
            and is_name(positional[0], k)
            and is_name(positional[1], v)
            and self_attribute(positional[2]) == "layer_idx"
        ):
            params = forward.params
            named = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
            return CacheUpdate(index, cache, "cache_position" if "cache_position" in named else None)
    return None


def find_o_proj(module: cst.Module, class_name: str, where: str, op: str) -> tuple[cst.FunctionDef, str, int]:
    """(forward, its **kwargs name, index of `x = self.o_proj(x)`) of the attention class."""
    forward, kwargs = attention_forward(module, class_name, where, op)
    for index, statement in enumerate(body_statements(forward)):
        if self_call(single_assign(statement)) == "o_proj":
            return forward, kwargs, index
    raise AnchorNotFoundError(
        f"{class_name}.forward in {where} has no `x = self.o_proj(x)` statement",
        f"this release changed the attention's output projection; the {op} injection cannot fold it",
    )


def is_name_arg(call: cst.Call) -> bool:
    return len(call.args) >= 1 and isinstance(call.args[0].value, cst.Name)


def rotary_is_sectioned(module: cst.Module, call: cst.Call) -> bool:
    """True when the rotary function called takes `mrope_section` (transformers <= 5.16)."""
    name = cst.ensure_type(call.func, cst.Name).value
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return "mrope_section" in parameter_names(statement)
    return len(call.args) >= 5


def insert_after_docstring(
    statements: list[cst.BaseStatement], new: Sequence[cst.BaseStatement]
) -> list[cst.BaseStatement]:
    keep = 1 if statements and is_docstring(statements[0]) else 0
    return [*statements[:keep], *new, *statements[keep:]]


def layer_to_patch(module: cst.Module, ctx, file_name: str, op: str):
    """(injection, where, layer) for block `op`, or None when the layer's forward already has its guard."""
    from pto_patch.patching.codemods.guards import has_guard

    injection = ctx.spec.injections[op]
    where = ctx.where(file_name)
    layer = find_decoder_layer(module, injection.classes, where, op)
    return None if has_guard(layer.forward, injection.switch) else (injection, where, layer)


def with_layer_body(
    module: cst.Module,
    layer: DecoderLayer,
    statements: list[cst.BaseStatement],
    guard: Sequence[cst.BaseStatement],
) -> cst.Module:
    """`module` with the layer's forward holding `statements`, `guard` first (after the docstring)."""
    forward = with_body(layer.forward, insert_after_docstring(statements, guard))
    return replace_method(module, layer.class_name, forward)
