"""The reference's ACL graph settings, as torchair documents them, and how its captures are counted.

The reference script compiles with torchair's `CompilerConfig`: `experimental_config.frozen_parameter`
(weights keep their addresses between replays) and `experimental_config.tiling_schedule_optimize`, then
`torch.compile(..., fullgraph=True)`. Where torch_npu registers the `npugraph_ex` backend (torchair
26.0.0 and later, where "reduce-overhead" is deprecated), that backend is used with
`options={"frozen_parameter": True}`; it has no tiling_schedule_optimize option. Elsewhere torchair's
npu backend with `mode = "reduce-overhead"` and frozen_parameter only: torchair lists
`experimental_config.tiling_schedule_optimize` among the settings reduce-overhead does not support
(`configs/compiler_config.py`, `unsupport_aclgraphconfig_list`: "may not take effect or report error"),
so the reference's second flag is left off there. Shapes are fixed (`dynamic=False`): torchair documents
reduce-overhead without dynamic shapes, and the static cache fixes every decode step's shapes.

Both capture on a graph's first call, with no eager run before (`AclConcreteGraph(...,
num_warmup_iters=0)`): graph_decode runs one eager step before each capture so every kernel exists.

torchair records its captures per FX graph in `torch._dynamo.utils.counters["npugraph_ex"]`
(`captured_<graph>`: how many captures that graph holds; torchair `_acl_concrete_graph/acl_graph.py`).
"""

from __future__ import annotations

import warnings as python_warnings
from dataclasses import dataclass, field
from typing import Any

from pto_patch.errors import PtoPatchError

NPUGRAPH_EX = "npugraph_ex"
REDUCE_OVERHEAD = "reduce-overhead"
# (attribute path on CompilerConfig, value): what the reference sets that reduce-overhead supports, in
# the order it sets them.
REFERENCE_SETTINGS = (
    ("mode", REDUCE_OVERHEAD),
    ("experimental_config.frozen_parameter", True),
)
# What the reference also sets and torchair's reduce-overhead lists as unsupported (left off, said so).
UNSUPPORTED_IN_REDUCE_OVERHEAD = ("experimental_config.tiling_schedule_optimize",)
NPUGRAPH_EX_OPTIONS = {"frozen_parameter": True}
SETTING_HINT = (
    "the installed torchair does not accept the reference's ACL graph settings; "
    "run without --use_acl_graph, or install the torch_npu release matching your CANN"
)


@dataclass(frozen=True)
class AclGraphBackend:
    """What torch.compile is handed for ACL graph, and the settings it carries (for the report)."""

    backend: Any  # a backend callable, or a registered backend's name
    options: dict[str, Any] | None  # torch.compile(options=...)
    kind: str  # NPUGRAPH_EX or REDUCE_OVERHEAD
    settings: dict[str, Any] = field(default_factory=dict)
    why: str = ""
    notes: tuple[str, ...] = ()  # what torchair warned while configuring

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "settings": dict(self.settings),
            "why": self.why,
            "torchair_notes": list(self.notes),
        }


def import_torchair():
    """torchair, or None where it cannot be used here (missing, or present without torch_npu / CANN)."""
    try:
        import torchair

        torchair.CompilerConfig  # noqa: B018 - torch_npu's lazy proxy raises here until torchair is loaded
    except Exception:
        return None
    return torchair


def _set(config, path: str, value) -> None:
    *parents, name = path.split(".")
    target = config
    for parent in parents:
        target = getattr(target, parent)
    setattr(target, name, value)  # torchair's configs raise ValueError for an option they lack


def reference_config(torchair):
    """torchair's CompilerConfig with the reference's settings; a setting it rejects is a PtoPatchError."""
    config = torchair.CompilerConfig()
    for path, value in REFERENCE_SETTINGS:
        try:
            _set(config, path, value)
        except Exception as exc:  # torchair's OptionValue raises ValueError; older releases lack attributes
            detail = " ".join(str(exc).split()) or type(exc).__name__
            raise PtoPatchError(
                f"torchair rejects CompilerConfig().{path} = {value!r}: {detail}", SETTING_HINT
            ) from exc
    return config


def npugraph_ex_offered() -> bool:
    from torch._dynamo import list_backends

    return NPUGRAPH_EX in list_backends(exclude_tags=())


def check_settings() -> None:
    """Before anything loads: the installed torchair (if any) accepts every setting the run will use."""
    torchair = import_torchair()
    if torchair is not None and not npugraph_ex_offered():
        reference_config(torchair)


def acl_graph_backend(torchair) -> AclGraphBackend:
    """npugraph_ex where torch_npu registers it, else torchair's npu backend in reduce-overhead mode."""
    if npugraph_ex_offered():
        return AclGraphBackend(
            NPUGRAPH_EX,
            dict(NPUGRAPH_EX_OPTIONS),
            NPUGRAPH_EX,
            settings=dict(NPUGRAPH_EX_OPTIONS),
            why="torch_npu registers the npugraph_ex backend (torchair 26.0.0+), which replaces reduce-overhead; "
            "it has no tiling_schedule_optimize option",
        )
    with python_warnings.catch_warnings(record=True) as caught:
        python_warnings.simplefilter("always")
        config = reference_config(torchair)
        backend = torchair.get_npu_backend(compiler_config=config)
    notes = tuple(dict.fromkeys(" ".join(str(w.message).split()) for w in caught))
    return AclGraphBackend(
        backend,
        None,
        REDUCE_OVERHEAD,
        settings={path: value for path, value in REFERENCE_SETTINGS},
        why="no npugraph_ex backend is registered here, so torchair's npu backend in reduce-overhead mode; "
        f"the reference's {', '.join(path.rsplit('.', 1)[-1] for path in UNSUPPORTED_IN_REDUCE_OVERHEAD)} "
        "is left off (torchair: unsupported in reduce-overhead)",
        notes=notes,
    )


def captures() -> int | None:
    """ACL graph captures torchair has recorded in this process, over all its graphs (None: it records none,
    as a torchair without this counter does not)."""
    from torch._dynamo.utils import counters

    recorded = [count for key, count in counters[NPUGRAPH_EX].items() if key.startswith("captured_")]
    return sum(recorded) if recorded else None
