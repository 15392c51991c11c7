"""A model is a spec: data under `templates/specs/<name>.json`, validated into a frozen dataclass.

Supporting another Qwen2.5-VL or Qwen3-VL fine-tune means adding a JSON file there (or passing the path
of one to `--model`), not code. Each spec names its architecture family (model/family.py), records where its
values come from (`sources`) and where public sources disagree (`disagreements`).
"""

from __future__ import annotations

import keyword
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, SpecError
from pto_patch.model import input_files
from pto_patch.model.family import FAMILIES, Family, family
from pto_patch.resources import templates_dir

# The reference system's three ops, then the decoder-layer blocks (several of a layer's ops in one launch).
OPS = (
    "rms_norm",
    "mrope",
    "swiglu_mlp",
    "residual_rms_norm",
    "mlp_block",
    "attention_prologue",
    "attention_core",
)
# The decoder-layer blocks, and the ops each does the work of: while a block is on, the guards of those ops
# inside a decoder layer are not reached (their calls stay 0 there), which is not a failure.
BLOCK_OPS = ("residual_rms_norm", "mlp_block", "attention_prologue", "attention_core")
REFERENCE_OPS = ("rms_norm", "mrope", "swiglu_mlp")  # the reference system's flags
BLOCKS = {"attention_prologue": ("mrope",), "mlp_block": ("swiglu_mlp", "residual_rms_norm")}
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
    # The architecture family (Qwen2.5-VL, Qwen3-VL): what every spec of one transformers model dir shares.
    family: Family = FAMILIES["qwen2_5_vl"]
    tiny: dict[str, Any] = field(default_factory=dict)
    full_width: dict[str, Any] = field(default_factory=dict)
    # False: the checkpoint ships its own lm_head.weight (the 7B models); True: lm_head is the embedding.
    tie_word_embeddings: bool = True
    # The checkpoint's public config.json values, as recorded from `sources`.
    checkpoint: dict[str, Any] = field(default_factory=dict)
    sources: tuple[dict[str, str], ...] = ()
    disagreements: tuple[str, ...] = ()
    source_path: Path | None = None

    @property
    def builtin(self) -> bool:
        """Shipped with pto-patch (under templates/specs/), rather than a spec file passed by path."""
        return self.source_path is not None and self.source_path.parent == specs_dir()

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
        from pto_patch.model.spec_data import check_spec_data  # only when a spec is read, not on --help

        check_spec_data(data, where)  # types, names and paths: nothing reaches outside the folder
        # A spec file written before families existed names none: its model_type says which it is.
        architecture = family(str(data.get("family", data["model_type"])), where)
        if data["transformers_model_dir"] != architecture.name:
            raise SpecError(
                f"model spec {where}: family '{architecture.name}' lives in transformers' "
                f"models/{architecture.name}, not models/{data['transformers_model_dir']}",
                f"set transformers_model_dir to {architecture.name!r}, or name the family that matches it",
            )
        injections = {}
        for op, entry in data["injections"].items():
            if op not in OPS:
                raise SpecError(f"model spec {where} names unknown op '{op}'", f"ops are: {', '.join(OPS)}")
            if op in architecture.refused_ops:
                raise SpecError(
                    f"model spec {where}: {architecture.title} cannot take '{op}': {architecture.refused_ops[op]}",
                    f"remove '{op}' from the spec's injections",
                )
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
        renames = _validated_renames(data["class_renames"], where)
        tie = data.get("tie_word_embeddings", True)
        if not isinstance(tie, bool):
            raise SpecError(f"model spec {where}: tie_word_embeddings must be true or false", "fix the spec")
        sources = data.get("sources", [])
        if not isinstance(sources, list) or not all(
            isinstance(item, dict) and isinstance(item.get("url"), str) for item in sources
        ):
            raise SpecError(
                f'model spec {where}: sources must be a list of {{"url": ..., "what": ...}}',
                "compare it with templates/specs/gutenocr_3b.json",
            )
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
            family=architecture,
            tiny=dict(data.get("tiny", {})),
            full_width=dict(data.get("full_width", {})),
            tie_word_embeddings=tie,
            checkpoint=dict(data.get("checkpoint", {})),
            sources=tuple({str(k): str(v) for k, v in item.items()} for item in sources),
            disagreements=tuple(str(item) for item in data.get("disagreements", ())),
            source_path=source_path,
        )


RENAMES_HINT = 'give class_renames as [["Qwen2_5_VL", "MyModelVL"], ...] with your own prefix'


def _validated_renames(pairs: Any, where: str) -> tuple[tuple[str, str], ...]:
    """(old prefix, new prefix) pairs; a new prefix must be an identifier no old prefix matches again."""
    if not isinstance(pairs, list) or not all(isinstance(p, list | tuple) and len(p) == 2 for p in pairs):
        raise SpecError(f"model spec {where}: class_renames must be a list of [old, new] pairs", RENAMES_HINT)
    renames = tuple((str(a), str(b)) for a, b in pairs)
    for _old, new in renames:
        if not new.isidentifier() or keyword.iskeyword(new):
            raise SpecError(
                f"model spec {where}: class prefix {new!r} is not a Python identifier", RENAMES_HINT
            )
        clash = next((other for other, _ in renames if new.startswith(other)), None)
        if clash is not None:
            raise SpecError(
                f"model spec {where}: new class prefix {new!r} starts with the renamed prefix {clash!r}",
                "pick a prefix of your own that does not start with a Qwen class prefix",
            )
    return renames


def specs_dir() -> Path:
    return templates_dir() / "specs"


def known_specs() -> list[str]:
    return sorted(path.stem for path in specs_dir().glob("*.json"))


MAX_SPEC_BYTES = 1024 * 1024  # a built-in spec is ~3 KB


def _looks_like_path(name: str) -> bool:
    return name.endswith(".json") or "/" in name or "\\" in name


def _spec_for_hub_id(name: str) -> Path | None:
    """The built-in spec whose hub repo is `name` (`rootsautomation/GutenOCR-3B`), case aside."""
    for path in sorted(specs_dir().glob("*.json")):
        try:
            repo_id = input_files.load_json(path).get("hub_repo_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(repo_id, str) and repo_id.lower() == name.lower():
            return path
    return None


def spec_path(name: str) -> Path:
    """The spec file `--model` names: a built-in spec's name or hub repo id, or the path of a spec file."""
    known = ", ".join(known_specs()) or "(none)"
    if _looks_like_path(name):
        path = Path(name).expanduser()
        if path.is_file():
            return path.resolve()
        by_hub_id = None if path.exists() or name.endswith(".json") else _spec_for_hub_id(name)
        if by_hub_id is not None:
            return by_hub_id
        if path.is_dir():
            raise SpecError(
                f"--model {name} is a folder; --model names a model spec (one of: {known})",
                f"pass the model folder as --model-path {name}",
                exit_code=EXIT_USAGE,
            )
        raise SpecError(
            f"model spec file {path} does not exist",
            f"pass a built-in model name ({known}), its hub id, or the path of a spec .json file; "
            "the model folder goes to --model-path",
            exit_code=EXIT_USAGE,
        )
    path = specs_dir() / f"{name}.json"
    if not path.is_file() and Path(name).expanduser().is_dir():
        raise SpecError(
            f"--model {name} is a folder; --model names a model spec (one of: {known})",
            f"pass the model folder as --model-path {name}",
            exit_code=EXIT_USAGE,
        )
    if not path.is_file():
        import difflib

        names = list(known_specs())
        folded = name.strip().lower().replace("-", "_").replace(".", "_")
        near = [folded] if folded in names else difflib.get_close_matches(folded, names, n=1, cutoff=0.75)
        meant = f": did you mean {near[0]}?" if near else ""
        raise SpecError(
            f"unknown model '{name}'{meant}",
            f"known models: {known}; or pass the path of a spec .json file",
            exit_code=EXIT_USAGE,
        )
    return path


def load_spec(name: str) -> ModelSpec:
    """A built-in spec by name (`gutenocr_7b`), or a spec file by path (`./my_finetune.json`)."""
    path = spec_path(name)
    try:
        data = input_files.load_json(path, max_bytes=MAX_SPEC_BYTES)
    except input_files.UnreadableInput as exc:
        raise SpecError(f"model spec: {exc}", "fix the spec file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(
            f"cannot read model spec {path}: {exc}", "check the file and its permissions"
        ) from exc
    if not isinstance(data, dict):
        raise SpecError(
            f"model spec {path} holds no JSON object", "compare it with templates/specs/gutenocr_3b.json"
        )
    return ModelSpec.from_json(data, source_path=path)


def all_specs() -> list[ModelSpec]:
    """Every built-in spec, by name."""
    return [load_spec(name) for name in known_specs()]


def default_run_ops(patched: tuple[str, ...]) -> tuple[str, ...]:
    """What a run switches on without --ops: the reference's flags among the patched ops (the blocks are
    asked for by name or with `all`); a folder patched with blocks only runs those."""
    return tuple(op for op in patched if op in REFERENCE_OPS) or patched


def parse_ops(text: str | None, spec: ModelSpec) -> tuple[str, ...]:
    """`rms_norm,mrope` -> ('rms_norm', 'mrope'), in the canonical order; None means every op of the spec."""
    if text is None or text.strip() == "all":
        return tuple(op for op in OPS if op in spec.injections)
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    if not wanted:
        raise SpecError(
            "--ops names no op",
            f"choose from: {', '.join(op for op in OPS if op in spec.injections)} (or leave --ops out for all)",
            exit_code=EXIT_USAGE,
        )
    refused = [op for op in wanted if op in spec.family.refused_ops]
    if refused:
        op = refused[0]
        raise SpecError(
            f"{op} is not available for {spec.family.title} models ({spec.name}): {spec.family.refused_ops[op]}",
            f"leave it out; choose from: {', '.join(op for op in OPS if op in spec.injections)}",
            exit_code=EXIT_USAGE,
        )
    unknown = [op for op in wanted if op not in spec.injections]
    if unknown:
        raise SpecError(
            f"unknown op(s) {', '.join(unknown)} for model '{spec.name}'",
            f"choose from: {', '.join(op for op in OPS if op in spec.injections)}",
            exit_code=EXIT_USAGE,
        )
    return tuple(op for op in OPS if op in wanted)


@dataclass(frozen=True)
class OpsAsked:
    """`--ops` read once: the named ops (canonical order), `all` (every op patched in), or nothing
    (None: the ops the folder's patch switches on by default)."""

    named: tuple[str, ...] | None = None
    every_patched: bool = False

    @classmethod
    def read(cls, text: str | None, spec: ModelSpec) -> OpsAsked:
        """Parse `--ops` (a usage error names an unknown or refused op)."""
        if text is None:
            return cls()
        return cls(parse_ops(text, spec), every_patched=text.strip() == "all")

    def may_switch_on(self, spec: ModelSpec, patched: tuple[str, ...]) -> tuple[str, ...]:
        """Every op a run may switch on: the named ops; with `all`, every op patched in; else what the
        folder's patch switches on by default (`patched`: the ops apply patched in, decided once)."""
        if self.every_patched and patched:
            return tuple(op for op in OPS if op in patched)
        if self.named is not None:
            return self.named
        return default_run_ops(patched or parse_ops(None, spec))
