"""The options every run shares (verify's and bench's extend them), checked before anything loads."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, PtoPatchError
from pto_patch.run.device import dtype_key
from pto_patch.run.graph import graph_decode
from pto_patch.run.graph.acl_graph import check_settings
from pto_patch.run.graph.graph_decode import CACHE_KINDS
from pto_patch.run.hub_kernels import check_hub_kernels
from pto_patch.run.limits import check_compile_values, check_tolerances
from pto_patch.run.op_choice import KERNEL_BACKENDS


@dataclass(frozen=True)
class RunOptions:
    """What verify and bench both run: the model and its input, where, in which dtype, how often,
    which kernels and how compiled. Each command's options extend it."""

    model: str = "gutenocr_3b"
    model_path: Path | None = None
    prompt: str | None = None
    image: Path | None = None
    simple_prompt: bool = False
    device: str | None = None
    dtype: str = "bf16"
    warmup: int = 5
    iters: int = 5
    output_length: int = 50
    ops: str | None = None
    kernel_backend: str | None = None
    use_compile: bool = False
    compile_backend: str = "inductor"
    compile_mode: str | None = None
    use_acl_graph: bool = False
    cache: str = "auto"  # run.graph.graph_decode.CACHE_KINDS: the KV cache a compiled run generates with
    use_dynamic_config: bool = False
    allow_modified: bool = False
    hub_kernels: bool = False  # load with use_kernels=True (run/hub_kernels.py)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {key: (str(value) if isinstance(value, Path) else value) for key, value in data.items()}


def parse_batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        batches = ()
    if not batches or any(batch < 1 for batch in batches):
        raise PtoPatchError(
            f"--batches '{text}' is not a list of batch sizes",
            "pass comma-separated positive integers, e.g. --batches 1,4,8",
            exit_code=EXIT_USAGE,
        )
    return batches


def check_counts(warmup: int, iters: int, batch: int, output_length: int) -> None:
    if warmup < 0:
        raise PtoPatchError(
            f"--warmup must be 0 or more, got {warmup}", "pass --warmup 0", exit_code=EXIT_USAGE
        )
    for name, value in (("--iters", iters), ("--batch", batch), ("--output_length", output_length)):
        if value < 1:
            raise PtoPatchError(
                f"{name} must be at least 1, got {value}", f"pass {name} 1", exit_code=EXIT_USAGE
            )


def compares(use_pto: bool, baseline_only: bool) -> bool:
    """Whether a verify compares PTO with the baseline: always, unless --baseline-only (a usage error
    together with --use_pto). Every verify path (text, OCR, vLLM, compiled, graph) decides with this."""
    if baseline_only and use_pto:
        raise PtoPatchError(
            "--baseline-only and --use_pto ask for opposite runs",
            "drop one: verify compares baseline and PTO by default; --baseline-only runs the baseline alone",
            exit_code=EXIT_USAGE,
        )
    return not baseline_only


def check_option_values(options: RunOptions, batch: int) -> None:
    """Reject bad option values (usage errors) before any folder, device or model is touched (`--ops`,
    which needs the spec, is read with it: run.start.plan_run)."""
    check_counts(options.warmup, options.iters, batch, options.output_length)
    check_tolerances(options)  # finite: a NaN passes nothing and is no JSON (run/limits)
    dtype_key(options.dtype)
    if options.kernel_backend is not None and options.kernel_backend not in KERNEL_BACKENDS:
        raise PtoPatchError(
            f"--kernel-backend '{options.kernel_backend}' is unknown",
            f"choose from: {', '.join(KERNEL_BACKENDS)}",
            exit_code=EXIT_USAGE,
        )
    if options.cache not in CACHE_KINDS:
        raise PtoPatchError(
            f"--cache '{options.cache}' is unknown",
            f"choose from: {', '.join(CACHE_KINDS)}",
            exit_code=EXIT_USAGE,
        )
    check_compile_values(options)  # --mode known, --mode and --cache static only on compiled runs
    if options.use_compile or options.use_acl_graph:
        check_compile_backend(options.compile_backend)
        from pto_patch.run.graph.compiling import cache_kind

        if cache_kind(options) == graph_decode.STATIC:
            graph_decode.check_release()  # a transformers whose static cache differs stops here
    if options.use_acl_graph:
        check_settings()  # a setting the installed torchair rejects stops the run here, not after loading
    check_hub_kernels(options.hub_kernels)  # so does --hub-kernels without a `kernels` transformers takes


def check_compile_backend(name: str) -> None:
    from torch._dynamo import list_backends

    known = list_backends(exclude_tags=())
    if name not in known:
        raise PtoPatchError(
            f"--backend '{name}' is not a torch.compile backend here",
            "choose eager, aot_eager or inductor (all: torch._dynamo.list_backends()); "
            "the kernels' backend is --kernel-backend",
            exit_code=EXIT_USAGE,
        )
