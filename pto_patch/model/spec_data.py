"""A spec is data: its fields' types, and every name and path in it, checked before a field is used.

A spec file is the user's input, so nothing in it may make a command run code from elsewhere:
- each field has the JSON type the spec format gives it (`FIELD_TYPES`; a wrong one is one line, never a
  TypeError deep in `ModelSpec.from_json`);
- `modeling_file` and `configuration_file` are plain names of Python files in the model folder
  (`modeling_qwen2_5_vl.py`): no folder, no `..`, no absolute path;
- every `auto_map` entry is `MODULE.CLASS` with MODULE one of those two files (without `.py`) and CLASS an
  identifier, so transformers imports the folder's own copies: an absolute module path, a path outside
  the folder, or a hub reference (`other/repo--module.Class`, which makes transformers fetch remote code) is
  refused;
- class and function names (injections, renames) are Python identifiers, and a new class prefix starts with
  a capital letter and is no builtin, keyword or module name the modeling code could mean (`torch`,
  `isinstance`, `math`): a renamed name can never shadow one of them.
Each refusal is a SpecError (exit 2) naming the spec, the field and the value, with a hint.
"""

from __future__ import annotations

import builtins
import keyword
import sys
from typing import Any

from pto_patch.errors import SpecError

COMPARE_HINT = "compare it with templates/specs/gutenocr_3b.json"

FIELD_TYPES: dict[str, tuple[type, str]] = {
    "name": (str, "a string"),
    "description": (str, "a string"),
    "hub_repo_id": (str, "a string"),
    "model_path_env": (str, "a string"),
    "family": (str, "a string"),
    "model_type": (str, "a string"),
    "transformers_model_dir": (str, "a string"),
    "modeling_file": (str, "a string"),
    "configuration_file": (str, "a string"),
    "class_renames": (list, "a list of [old, new] pairs"),
    "auto_map": (dict, 'an object of "AutoClass": "module.Class"'),
    "injections": (dict, "an object of op: injection"),
    "mrope_section": (list, "a list of whole numbers"),
    "tiny": (dict, "an object"),
    "full_width": (dict, "an object"),
    "checkpoint": (dict, "an object"),
    "tie_word_embeddings": (bool, "true or false"),
    "sources": (list, "a list"),
    "disagreements": (list, "a list of strings"),
}

# Libraries the modeling code imports besides the standard library's modules.
MODELING_MODULES = frozenset(
    {"torch", "nn", "F", "np", "numpy", "transformers", "safetensors", "pto_kernels"}
)


def _refuse(where: str, what: str, hint: str = COMPARE_HINT) -> None:
    raise SpecError(f"model spec {where}: {what}", hint)


def check_spec_data(data: dict[str, Any], where: str) -> None:
    """Refuse a spec whose fields have the wrong types, or whose names or paths reach outside the model
    folder or shadow what the modeling code uses (see the module docstring)."""
    for key, (kind, said) in FIELD_TYPES.items():
        value = data.get(key)
        if key in data and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
            _refuse(where, f"{key} must be {said}, not {type(value).__name__}")
    section = data.get("mrope_section", [])
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in section):
        _refuse(where, f"mrope_section must be a list of positive whole numbers, not {section!r}")
    if not all(isinstance(item, str) for item in data.get("disagreements", [])):
        _refuse(where, "disagreements must be a list of strings")
    modules = [
        _python_file(data, key, where) for key in ("modeling_file", "configuration_file") if key in data
    ]
    for op, entry in data.get("injections", {}).items():
        if not isinstance(entry, dict):
            _refuse(where, f"injection {op!r} must be an object")
        for part in ("classes", "functions"):
            names = entry.get(part, [])
            if not isinstance(names, list) or not all(_is_name(name) for name in names):
                _refuse(where, f"injection {op!r}: {part} must be a list of Python names, not {names!r}")
    for pair in data.get("class_renames", []):
        if isinstance(pair, list) and len(pair) == 2:
            _check_rename(pair, where)
    for key, ref in data.get("auto_map", {}).items():
        _check_auto_map(key, ref, modules, where)


def _is_name(value: Any) -> bool:
    return isinstance(value, str) and value.isidentifier() and not keyword.iskeyword(value)


def _python_file(data: dict[str, Any], key: str, where: str) -> str:
    """The module name of a plain `NAME.py` file name in the folder."""
    name = data[key]
    stem = name.removesuffix(".py")
    if not name.endswith(".py") or not _is_name(stem):
        _refuse(
            where,
            f"{key} {name!r} is not the name of a Python file in the model folder",
            f"give {key} as a plain file name such as modeling_qwen2_5_vl.py: no folder, no path",
        )
    return stem


def shadowed(name: str) -> str | None:
    """What a class prefix `name` would shadow in the modeling code (a builtin, a module), or None."""
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        return "a Python keyword"
    if hasattr(builtins, name):
        return "a Python builtin"
    if name in MODELING_MODULES or name in sys.stdlib_module_names:
        return "a module the modeling code may import"
    return None


RENAME_PREFIX_HINT = 'give class_renames a class-like prefix of your own, e.g. ["Qwen2_5_VL", "MyModelVL"]'


def _check_rename(pair: list, where: str) -> None:
    old, new = pair
    if not _is_name(old):
        _refuse(where, f"renamed class prefix {old!r} is not a Python identifier")
    if not isinstance(new, str) or not new.isidentifier() or keyword.iskeyword(new):
        return  # spec._validated_renames says it is no identifier
    shadow = shadowed(new)
    if shadow is not None or not new[:1].isupper():
        reason = f"is {shadow}" if shadow else "does not start with a capital letter, as a class name does"
        _refuse(
            where,
            f"new class prefix {new!r} {reason}",
            RENAME_PREFIX_HINT,
        )


AUTO_MAP_HINT = (
    "give auto_map values as MODULE.CLASS with MODULE the spec's modeling_file or configuration_file "
    "(without .py): nothing is imported from another place or fetched from the hub"
)


def auto_map_problem(key: Any, ref: Any, modules: list[str]) -> str | None:
    """Why an auto_map entry does not name a class of the folder's own `modules`, or None where it does."""
    module, _, class_name = ref.partition(".") if isinstance(ref, str) else ("", "", "")
    if _is_name(key) and module in modules and _is_name(class_name):
        return None
    return f"auto_map {key!r} names {ref!r}, not a class in the model folder's " + " or ".join(
        f"{m}.py" for m in modules
    )


def _check_auto_map(key: Any, ref: Any, modules: list[str], where: str) -> None:
    problem = auto_map_problem(key, ref, modules)
    if problem is not None:
        _refuse(where, problem, AUTO_MAP_HINT)


def folder_auto_map_problem(config: Any, modules: list[str]) -> str | None:
    """Why a model folder's config.json `auto_map` could make transformers import code from outside the
    folder or fetch it from the hub (an edit after apply, run with --allow-modified), or None."""
    auto_map = config.get("auto_map", {}) if isinstance(config, dict) else {}
    if not isinstance(auto_map, dict):
        return f"config.json's auto_map is {type(auto_map).__name__}, not an object"
    problems = (auto_map_problem(key, ref, modules) for key, ref in auto_map.items())
    return next((f"config.json's {problem}" for problem in problems if problem), None)
