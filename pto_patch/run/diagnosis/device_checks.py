"""What a first 910B run must check, named, in `doctor`: the facts about PyPTO under a device graph and
the cache-writing prologue that no CPU can establish.

- `capture_replay`: a PyPTO kernel (rms_norm) launched inside an npugraph_ex capture and then replayed on
  new inputs gives what it gives eagerly, and is in the captured graph (not a break, not a fallback);
- `position_read_first`: the cache-writing prologue (`attention_prologue_cached` with `advance`) reads its
  position before its length task writes it (the same int64 tensor, aliased as input and output): the rows
  land at the position, not one further;
- `position_low_word`: the int64 position's low word is the word the kernel reads and advances: the rows
  do not land at row 0 (the high word) and the position after the call is exactly one more;
- `cache_in_place`: the caches and the position stay in place under npugraph_ex: after a capture and a
  replay, the caller's tensors (same storage) hold what an eager call writes.

They run where the device is an NPU (doctor passes `ran=True` there), on the backend given (pypto on an
NPU). Anywhere else each is "not run", saying what it would check and why it did not run; it is never
reported as passed. The tests run the same functions on the CPU through stand-ins (the torch and fused
backends, PyPTO's kernels through its interpreter, the counting torchair's npugraph_ex): that proves each
check's logic, that it fails on a wrong kernel, and the kernels' logic, not the device facts themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from pto_patch.run.graph.graph_decode import GraphOps

NPUGRAPH_EX = "npugraph_ex"
CHECKS = {
    "capture_replay": "a PyPTO kernel (rms_norm) launched inside an npugraph_ex capture and replayed on new "
    "inputs gives the eager result",
    "position_read_first": "the cache-writing prologue reads its aliased position before its length task "
    "writes it (rows land at the position, not one further)",
    "position_low_word": "the int64 position's low word is the word the kernel reads and advances (rows not "
    "at row 0, the position exactly one more after)",
    "cache_in_place": "the cache writes stay in place under npugraph_ex (same storage, the eager contents "
    "after a capture and a replay)",
}


@dataclass
class DeviceCheck:
    name: str
    checks: str  # what it checks, in words
    status: str  # "ok", "failed", "error", "not run"
    backend: str | None = None
    reason: str | None = None


def not_run(why: str) -> list[DeviceCheck]:
    return [DeviceCheck(name, what, "not run", reason=why) for name, what in CHECKS.items()]


def _verdict(name: str, backend: str, problems: list[str]) -> DeviceCheck:
    status = "failed" if problems else "ok"
    return DeviceCheck(name, CHECKS[name], status, backend, "; ".join(problems) or None)


def _relative(torch, got, want) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


def prologue_cached(kernels, modules: dict, inputs: dict, caches, position):
    """One call of the cache-writing prologue for the first token, into `caches` at `position` (advanced)."""
    attention, norm, row = modules["attention"], modules["norm"], slice(0, 1)
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    return kernels.ops.attention_prologue_cached(
        inputs["hidden_states"][:, row], norm.weight, inputs["eps"], q.weight, q.bias, k.weight, k.bias,
        v.weight, v.bias, inputs["cos"][:, :, row], inputs["sin"][:, :, row], list(inputs["section"]),
        attention.head_dim, *caches, position, True,
    )  # fmt: skip


def _fresh(inputs: dict):
    return inputs["key_cache"].clone(), inputs["value_cache"].clone(), inputs["position"].clone()


def capture_replay(kernels, modules, inputs, backend: str, tolerance: float, graph_backend=NPUGRAPH_EX):
    import torch

    weight, eps = modules["norm"].weight, inputs["eps"]

    def step(hidden):
        return kernels.rms_norm_wrapper(hidden, weight, eps)

    ops = GraphOps()
    compiled = torch.compile(step, backend=ops.backend(graph_backend), fullgraph=True, dynamic=False)
    first = inputs["hidden_states"]
    second = first * 0.5 + 0.25
    kernels.reset_stats()
    with torch.no_grad(), kernels.enabled(("rms_norm",), backend=backend):
        eager = step(first).clone(), step(second).clone()  # the kernel is built here, before the capture
        graph = compiled(first).clone(), compiled(second).clone()  # the capture, then a replay
        stats = kernels.stats()["rms_norm"]
    problems = []
    if not any(graph_ops.get("rms_norm") for graph_ops in ops.graphs):
        problems.append("rms_norm is not in the captured graph")
    if stats["fallbacks"]:
        problems.append(f"rms_norm fell back: {stats['first_fallback_error']}")
    for when, got, want in (("the capture", graph[0], eager[0]), ("the replay", graph[1], eager[1])):
        error = _relative(torch, got, want)
        if not error <= tolerance:
            problems.append(f"{when} differs from eager: relative error {error:.3g} over {tolerance:g}")
    return _verdict("capture_replay", backend, problems)


def position_checks(kernels, modules, inputs, backend: str, tolerance: float) -> list[DeviceCheck]:
    """position_read_first and position_low_word, from one eager call on `backend` against the torch path."""
    import torch

    at = int(inputs["position"].reshape(-1)[0])
    original = inputs["key_cache"]
    with torch.no_grad():
        with kernels.enabled(("attention_prologue",), backend="torch"):
            want = _fresh(inputs)
            prologue_cached(kernels, modules, inputs, want[:2], want[2])
        kernels.reset_stats()
        with kernels.enabled(("attention_prologue",), backend=backend):
            got = _fresh(inputs)
            prologue_cached(kernels, modules, inputs, got[:2], got[2])
            fell_back = kernels.stats()["attention_prologue"]["fallbacks"]
    if fell_back:
        reason = f"attention_prologue fell back on {backend}: nothing of the kernel was checked"
        return [DeviceCheck(name, CHECKS[name], "failed", backend, reason) for name in list(CHECKS)[1:3]]

    def landed(row: int) -> bool:
        return all(
            _relative(torch, g[:, :, row], w[:, :, at]) <= tolerance
            for g, w in zip(got[:2], want[:2], strict=True)
        )

    def untouched(row: int) -> bool:
        return torch.equal(got[0][:, :, row], original[:, :, row])

    first = []
    if not landed(at):
        moved = " (they are at the position plus one: the length was written first)" if landed(at + 1) else ""
        first.append(f"the rows written differ from the reference's at position {at}{moved}")
    if not untouched(at + 1):
        first.append(f"row {at + 1}, past the position, was written")
    after = got[2].reshape(-1)[:1]
    words = after.view(torch.int32).tolist()  # little-endian: [low, high]
    low = []
    if at != 0 and not untouched(0):
        low.append("row 0 was written (the high word, 0, read as the position)")
    if int(after[0]) != at + 1:
        low.append(
            f"the position after the call is {int(after[0])} (words low {words[0]}, high {words[1]}), not {at + 1}"
        )
    return [_verdict("position_read_first", backend, first), _verdict("position_low_word", backend, low)]


def cache_in_place(kernels, modules, inputs, backend: str, graph_backend=NPUGRAPH_EX) -> DeviceCheck:
    import torch

    def step(key_cache, value_cache, position):
        return prologue_cached(kernels, modules, inputs, (key_cache, value_cache), position)

    compiled = torch.compile(step, backend=graph_backend, fullgraph=True, dynamic=False)
    problems = []
    with torch.no_grad(), kernels.enabled(("attention_prologue",), backend=backend):
        want = _fresh(inputs)
        step(*want)  # eager: builds the kernel, and what the caches hold after one step
        held = _fresh(inputs)
        addresses = [t.data_ptr() for t in held]
        compiled(*held)  # the capture
        for tensor, start in zip(held, _fresh(inputs), strict=True):
            tensor.copy_(start)  # the step's inputs again, in the same storage
        compiled(*held)  # a replay
    if [t.data_ptr() for t in held] != addresses:
        problems.append("the caches or the position moved to other storage")
    for name, got, expected in zip(("key cache", "value cache", "position"), held, want, strict=True):
        if not torch.equal(got, expected):
            problems.append(f"after the replay the {name} differs from the eager call's")
    return _verdict("cache_in_place", backend, problems)


def run_all(
    kernels, modules, inputs, backend: str, tolerance: float, graph_backend=NPUGRAPH_EX
) -> list[DeviceCheck]:
    """Every check on `backend`; one that raises is an error with its reason, the others still run."""
    found: list[DeviceCheck] = []
    for names, run in (
        (("capture_replay",), lambda: [capture_replay(kernels, modules, inputs, backend, tolerance, graph_backend)]),
        (("position_read_first", "position_low_word"), lambda: position_checks(kernels, modules, inputs, backend, tolerance)),
        (("cache_in_place",), lambda: [cache_in_place(kernels, modules, inputs, backend, graph_backend)]),
    ):  # fmt: skip
        try:
            found += run()
        except Exception as exc:  # noqa: BLE001 - named per check, as doctor's op checks are
            found += [
                DeviceCheck(n, CHECKS[n], "error", backend, f"{type(exc).__name__}: {exc}") for n in names
            ]
    return found
