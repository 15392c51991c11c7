"""A model is a spec: data under `templates/specs/<name>.json`, validated into a frozen dataclass.

Supporting another Qwen2.5-VL fine-tune means adding a JSON file there, not code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch.errors import SpecError
from pto_patch.resources import templates_dir

OPS = ("rms_norm", "mrope", "swiglu_mlp")
# The kernel package's switch for each op; the patched code reads it at every call.
SWITCHES = {op: f"USE_PTO_{op.upper()}" for op in OPS}


@dataclass(frozen=True)
class Injection:
    """One op's injection point: the kernel-package switch and the classes or functions it targets."""

    op: str
    switch: str
    classes: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    hub_repo_id: str
    model_path_env: str
    model_type: str
    transformers_model_dir: str
    modeling_file: str
    configuration_file: str
    # Ordered (old prefix, new prefix) pairs, longest first, applied to classes defined in the files.
    class_renames: tuple[tuple[str, str], ...]
    # auto_map entries, written with the original (pre-rename) class names.
    auto_map: dict[str, str]
    injections: dict[str, Injection]
    mrope_section: tuple[int, ...]
    tiny: dict[str, Any] = field(default_factory=dict)
    full_width: dict[str, Any] = field(default_factory=dict)
    source_path: Path | None = None

    def renamed(self, class_name: str) -> str:
        """The name a class defined in the model's files gets in the patched files."""
        for old, new in self.class_renames:
            if class_name.startswith(old):
                return new + class_name[len(old) :]
        return class_name

    def renamed_auto_map(self) -> dict[str, str]:
        result = {}
        for key, ref in self.auto_map.items():
            module, _, cls = ref.rpartition(".")
            result[key] = f"{module}.{self.renamed(cls)}"
        return result

    @classmethod
    def from_json(cls, data: dict[str, Any], source_path: Path | None = None) -> ModelSpec:
        where = str(source_path) if source_path else "spec"
        required = (
            "name",
            "hub_repo_id",
            "model_path_env",
            "model_type",
            "transformers_model_dir",
            "modeling_file",
            "configuration_file",
            "class_renames",
            "auto_map",
            "injections",
            "mrope_section",
        )
        missing = [key for key in required if key not in data]
        if missing:
            raise SpecError(
                f"model spec {where} lacks {', '.join(missing)}",
                "compare it with templates/specs/gutenocr_3b.json",
            )
        injections = {}
        for op, entry in data["injections"].items():
            if op not in OPS:
                raise SpecError(f"model spec {where} names unknown op '{op}'", f"ops are: {', '.join(OPS)}")
            if "switch" not in entry or not (entry.get("classes") or entry.get("functions")):
                raise SpecError(
                    f"model spec {where}: injection '{op}' needs a 'switch' and 'classes' or 'functions'",
                    "compare it with templates/specs/gutenocr_3b.json",
                )
            if entry["switch"] != SWITCHES[op]:
                raise SpecError(
                    f"model spec {where}: injection '{op}' names switch '{entry['switch']}'",
                    f"the kernel package's switch for {op} is {SWITCHES[op]}",
                )
            injections[op] = Injection(
                op=op,
                switch=entry["switch"],
                classes=tuple(entry.get("classes", ())),
                functions=tuple(entry.get("functions", ())),
            )
        renames = tuple((str(a), str(b)) for a, b in data["class_renames"])
        return cls(
            name=data["name"],
            description=data.get("description", ""),
            hub_repo_id=data["hub_repo_id"],
            model_path_env=data["model_path_env"],
            model_type=data["model_type"],
            transformers_model_dir=data["transformers_model_dir"],
            modeling_file=data["modeling_file"],
            configuration_file=data["configuration_file"],
            class_renames=tuple(sorted(renames, key=lambda pair: -len(pair[0]))),
            auto_map=dict(data["auto_map"]),
            injections=injections,
            mrope_section=tuple(int(x) for x in data["mrope_section"]),
            tiny=dict(data.get("tiny", {})),
            full_width=dict(data.get("full_width", {})),
            source_path=source_path,
        )


def specs_dir() -> Path:
    return templates_dir() / "specs"


def known_specs() -> list[str]:
    return sorted(path.stem for path in specs_dir().glob("*.json"))


def load_spec(name: str) -> ModelSpec:
    path = specs_dir() / f"{name}.json"
    if not path.is_file():
        known = ", ".join(known_specs()) or "(none)"
        raise SpecError(f"unknown model '{name}'", f"known models: {known}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpecError(f"model spec {path} is not valid JSON: {exc}", "fix or reinstall pto-patch") from exc
    return ModelSpec.from_json(data, source_path=path)


def parse_ops(text: str | None, spec: ModelSpec) -> tuple[str, ...]:
    """`rms_norm,mrope` -> ('rms_norm', 'mrope'), in the canonical order; None means every op of the spec."""
    if text is None or text.strip() == "all":
        return tuple(op for op in OPS if op in spec.injections)
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if not wanted:
        raise SpecError(
            "--ops names no op",
            f"choose from: {', '.join(op for op in OPS if op in spec.injections)} (or leave --ops out for all)",
        )
    unknown = [op for op in wanted if op not in spec.injections]
    if unknown:
        raise SpecError(
            f"unknown op(s) {', '.join(unknown)} for model '{spec.name}'",
            f"choose from: {', '.join(op for op in OPS if op in spec.injections)}",
        )
    return tuple(op for op in OPS if op in wanted)
