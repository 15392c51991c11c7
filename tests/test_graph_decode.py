"""Graph runs: decode captures once per batch size over a static KV cache, counted, not assumed.

The model checks run verify / bench in fresh processes with a stand-in torchair of our own
(`tests/counting_torchair`) that logs every graph it is handed and the CompilerConfig it was built
with, and records captures the way torchair does. The cases that make the count rise (a growing
cache, a graph compiled while timing) must fail.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch

from pto_patch.errors import PtoPatchError
from pto_patch.run.graph import graph_decode
from pto_patch.run.graph.compiling import CompileSetup, CompileWatch, per_step_guard
from pto_patch.run.graph.graph_decode import CACHE_BUCKET, install, static_cache_length
from tests.torchair_runs import SKEWING_TORCHAIR, run_with_torchair

COUNTING_TORCHAIR = Path(__file__).resolve().parent / "counting_torchair"
REPO = Path(__file__).resolve().parents[1]


def test_the_static_cache_length_rounds_up_to_a_whole_bucket():
    assert static_cache_length(1) == CACHE_BUCKET
    assert static_cache_length(CACHE_BUCKET) == CACHE_BUCKET
    assert static_cache_length(CACHE_BUCKET + 1) == 2 * CACHE_BUCKET
    assert static_cache_length(0) == CACHE_BUCKET


# --- the forward of a graph run, on a toy model ------------------------------------------------------


class _Toy(torch.nn.Module):
    """Stands for a decoder: config for the static cache, forward(input_ids, cache=...)."""

    def __init__(self):
        super().__init__()
        from transformers import Qwen2Config

        self.config = Qwen2Config(
            num_hidden_layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, vocab_size=16
        )
        self.eager_calls = 0

    def forward(self, input_ids, cache=None, past_key_values=None, grow=None):
        self.eager_calls += 1
        return input_ids * 2 if grow is None else grow + 1


def _steps(model, batch: int, prompt: int, steps: int, grow: bool = False) -> dict:
    decode = graph_decode.installed(model)
    ids = torch.ones(batch, prompt, dtype=torch.long)
    with decode.generation(ids, steps) as extra:
        model.forward(ids, **extra)  # prefill
        for step in range(steps):
            model.forward(ids[:, -1:], **extra, grow=torch.ones(step + 1) if grow else None)
    return extra


@pytest.mark.parametrize(
    ("release", "keyword"),
    [("4.57.6", "past_key_values"), ("5.8.1", "past_key_values"), ("5.23.0", "past_key_values"),
     ("5.24.0", "cache"), ("5.25.0", "cache"), ("6.0.0.dev0", "cache")],
)  # fmt: skip
def test_the_static_cache_goes_under_the_keyword_the_release_takes(release, keyword):
    assert graph_decode.cache_keyword(release) == keyword


def test_prefill_runs_eagerly_and_every_decode_step_through_the_compiled_forward():
    model = _Toy()
    compiled_calls = []
    install(model, lambda *a, **k: compiled_calls.append(a[0].shape) or a[0], static_cache=True)
    first = _steps(model, batch=2, prompt=9, steps=5)
    # the prefill, then one eager decode step before the first compiled call (what a capture needs built)
    assert model.eager_calls == 2 and len(compiled_calls) == 5
    again = _steps(model, batch=2, prompt=30, steps=5)  # another prompt in the same bucket
    keyword = graph_decode.cache_keyword()
    assert list(first) == [keyword]
    assert again[keyword] is first[keyword]  # the same cache, addresses kept: what a capture replays
    other = _steps(model, batch=1, prompt=9, steps=5)
    assert other[keyword] is not first[keyword]  # each batch size its own cache and capture
    model.forward(torch.ones(1, 3, dtype=torch.long))  # outside a generation: as the model was
    # the same key again: its prefill only; a new batch size: prefill and a warm-up step; then the call outside
    assert model.eager_calls == 2 + 1 + 2 + 1 and len(compiled_calls) == 15
    decode = graph_decode.installed(model)
    assert decode.prefills == 3 and [call.key for call in decode.calls[-1:]] == ["batch 1, static cache 256"]
    assert [(c.key, c.primed) for c in decode.captures] == [
        ("batch 2, static cache 256", True),
        ("batch 1, static cache 256", True),
    ]


def _decode_step(input_ids, cache=None, past_key_values=None, grow=None):
    return (
        input_ids * 2 if grow is None else grow + 1
    )  # `grow`: a tensor of a new length each step, as a growing cache


def _watched(grow: bool, timed: bool):
    torch._dynamo.reset()
    model = _Toy()
    compiled = torch.compile(_decode_step, backend="eager", dynamic=False)
    decode = install(model, compiled, static_cache=not grow)
    watch = CompileWatch(CompileSetup("eager", None, False, "static", decode=decode))
    watch.switch("baseline")
    _steps(model, batch=1, prompt=4, steps=6, grow=grow)
    if timed:
        with graph_decode.timed(model):
            _steps(model, batch=1, prompt=4, steps=1, grow=False)
            _steps(model, batch=3, prompt=4, steps=1, grow=False)  # a batch size no warm-up ran
    return watch.finish()


def test_a_decode_that_recompiles_per_step_fails_naming_the_guard():
    steady = _watched(grow=False, timed=False)
    assert steady.graph_failures() == []
    assert steady.modes["baseline"].decode_graphs == {"batch 1, static cache 256": 1}
    growing = _watched(grow=True, timed=False)
    mode = growing.modes["baseline"]
    assert mode.decode_steps == 6 and mode.decode_graphs == {"batch 1, dynamic cache": 6}
    (failure,) = growing.graph_failures()
    assert failure.startswith("baseline: decode recompiles per step under a graph run (6 graphs for batch 1")
    assert "size mismatch" in failure  # the guard that failed, as torch words it
    failures, _ = growing.failures_and_warnings()
    assert failure in failures


def test_the_guard_named_is_the_one_that_fails_every_step():
    switch = "0/0: G['pto_kernels'].USE_PTO_RMS_NORM == False"
    steps = [f"0/{n}: G['pto_kernels']._rms_norm.count.calls == {5 * n}" for n in range(2, 6)]
    assert per_step_guard([switch, *steps, switch]) == steps[-1]
    assert per_step_guard([]) == "no recompile reason recorded"


def test_a_fullgraph_decode_that_breaks_is_one_line_naming_the_break():
    from pto_patch.run.graph.compiling import _whole

    def step(x):
        print("", end="")  # a builtin the tracer cannot put in a graph
        return x + 1

    torch._dynamo.reset()
    decode = _whole(torch.compile(step, backend="eager", fullgraph=True, dynamic=False))
    with pytest.raises(PtoPatchError) as raised:
        decode(torch.ones(2))
    message = raised.value.message
    assert message.startswith("the decode step does not compile whole for ACL graph (fullgraph=True): ")
    assert "print" in message and "\n" not in message and "--use_compile --cache static" in raised.value.hint


def test_a_graph_compiled_while_timing_fails():
    compilation = _watched(grow=False, timed=True)
    assert compilation.modes["baseline"].timed_graphs == 1  # batch 3 compiled inside the timed run
    assert compilation.graph_failures() == [
        "baseline: timed runs compiled 1 graph(s): the timings hold compiles"
    ]


def test_a_static_cache_replay_counts_once_per_decode_step(monkeypatch):
    """A captured decode step replays without Python: each step counts once as a replay of the ops
    captured in it. The capture probe is a stand-in here (no CUDA/NPU)."""
    from pto_patch.resources import kernels_dir

    monkeypatch.syspath_prepend(str(kernels_dir()))
    import pto_kernels
    from pto_kernels import _dispatch

    pto_kernels.enable(backend="torch")
    pto_kernels.reset_stats()
    capturing = {"on": False}
    monkeypatch.setattr(_dispatch, "capturing", lambda device_type: capturing["on"])
    x, w = torch.randn(1, 8), torch.ones(8)
    model = _Toy()
    captured = {"done": False}

    def graph(input_ids, cache=None, past_key_values=None, grow=None):
        if not captured["done"]:  # the first decode step captures: the op's body runs
            capturing["on"], captured["done"] = True, True
            torch.ops.pto_kernels.rms_norm(x, w, 1e-6)
            capturing["on"] = False
        return input_ids  # later steps replay on the device: no Python of the op runs

    install(model, graph, static_cache=True, kernels=pto_kernels)
    try:
        _steps(model, batch=1, prompt=4, steps=6)
        stats = pto_kernels.stats()["rms_norm"]
        assert stats["captured"] == 1 and stats["calls"] == 1 and stats["replays"] == 5
    finally:
        pto_kernels.disable()
        pto_kernels.reset_stats()


# --- the priming step leaves no trace ------------------------------------------------------------------


def _filled_cache(kind: str, batch: int = 2, prompt: int = 5):
    """A real transformers cache (the venv's release) holding a prompt's rows in each of its 2 layers."""
    from transformers import DynamicCache, Qwen2Config, StaticCache

    config = Qwen2Config(
        num_hidden_layers=2, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, vocab_size=16
    )
    cache = StaticCache(config=config, max_cache_len=16) if kind == "static" else DynamicCache(config=config)
    for layer in range(2):
        rows = torch.randn(batch, 1, prompt, 4)
        cache.update(rows, rows + 1, layer, {"cache_position": torch.arange(prompt)})
    return cache


def _state(cache) -> list[dict]:
    return [
        {name: (value.clone(), value.data_ptr()) if isinstance(value, torch.Tensor) else value
         for name, value in vars(layer).items()}
        for layer in cache.layers
    ]  # fmt: skip


def _same_state(before: list[dict], after: list[dict]) -> bool:
    def same(a, b):
        if isinstance(a, tuple):
            return a[1] == b[1] and a[0].shape == b[0].shape and torch.equal(a[0], b[0])
        return a == b

    return all(
        a.keys() == b.keys() and all(same(a[k], b[k]) for k in a) for a, b in zip(before, after, strict=True)
    )


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_a_step_run_inside_kept_leaves_the_cache_as_it_found_it(kind):
    """transformers 5.25's StaticLayer advances its cumulative_length in place and writes at it; a
    DynamicLayer rebinds its keys to a longer cat: after `kept`, the same storage holds the same rows and
    the same length, so a capture sees the cache it would have seen without the step."""
    from pto_patch.run.graph.cache_state import kept

    cache = _filled_cache(kind)
    before, length = _state(cache), int(cache.get_seq_length())  # 5.8+: the counter tensor itself
    row = torch.randn(2, 1, 1, 4)
    with kept(cache):
        for layer in range(2):
            cache.update(row, row, layer, {"cache_position": torch.tensor([length])})
        assert cache.get_seq_length() == length + 1  # the step did write
    assert _same_state(before, _state(cache)) and cache.get_seq_length() == length
    for layer in range(2):  # the next step writes where it would have written without the first
        cache.update(row, row, layer, {"cache_position": torch.tensor([length])})
    keys = cache.layers[0].keys
    assert torch.equal(keys[:, :, length], row[:, :, 0]) and int(cache.get_seq_length()) == length + 1


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_graph_decode_gives_the_eager_models_tokens_and_logits(cache, tmp_path: Path):
    """On a model whose forward reads and writes its cache (the tiny Qwen2.5-VL), batch 1 and 2, the venv's
    transformers: both generations of each capture key (the first is the one the priming step ran in) give
    the eager model's tokens and, at every step, its logits within the float32 tolerance. The release
    matrix runs the same in tests/test_graph_releases.py."""
    from pto_patch.tiny.model import make_tiny
    from tests import graph_against_eager

    folder = make_tiny(tmp_path / "tiny").path
    document = graph_against_eager.run(folder, cache, (1, 2), home=tmp_path)
    assert document["torchair"].startswith(str(graph_against_eager.COUNTING_TORCHAIR))
    assert [primed for _, primed in document["captures"]] == [True, True]
    assert graph_against_eager.mismatches(document) == []


@pytest.mark.slow
def test_a_graph_fault_the_stand_in_shares_with_every_graph_run_is_seen_against_eager(tmp_path: Path):
    """tests/skewing_torchair: from each graph's third call its logits favour one token. Judged against the
    eager model, graph decode differs from the third decode step on (a check of graph against graph cannot
    see it: both runs would hold it)."""
    from pto_patch.tiny.model import make_tiny
    from tests import graph_against_eager

    folder = make_tiny(tmp_path / "tiny").path
    document = graph_against_eager.run(folder, "static", (1,), home=tmp_path, torchair=SKEWING_TORCHAIR)
    assert document["torchair"].startswith(str(SKEWING_TORCHAIR))
    first, second = document["batches"][0]["generations"]
    assert not first["tokens_equal"] and first["first_step_beyond"] == 3  # prefill, capture, replay, skewed
    assert first["graph_tokens"][0][3:] == [0, 0, 0] and first["eager_tokens"][0][3:] != [0, 0, 0]
    assert second["first_step_beyond"] == 1  # a later generation: every replay is a third call or later
    assert len(graph_against_eager.mismatches(document)) == 2


# --- torchair's settings ------------------------------------------------------------------------------


def _stand_in_torchair(monkeypatch):
    spec = importlib.util.spec_from_file_location("torchair", COUNTING_TORCHAIR / "torchair" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "torchair", module)
    return module


def test_a_setting_torchair_rejects_stops_the_run_before_the_folder_is_read(monkeypatch, tmp_path):
    from pto_patch.run.verify import VerifyOptions, verify_model

    _stand_in_torchair(monkeypatch)
    monkeypatch.setenv("COUNTING_TORCHAIR_WITHOUT", "frozen_parameter")  # an older release
    options = VerifyOptions(
        model_path=tmp_path / "no-such-folder", use_acl_graph=True, compile_backend="eager"
    )
    with pytest.raises(PtoPatchError) as raised:
        verify_model(options)
    message = raised.value.message
    assert message.startswith("torchair rejects CompilerConfig().experimental_config.frozen_parameter")
    assert "has no option frozen_parameter" in message and "\n" not in message
    monkeypatch.delenv("COUNTING_TORCHAIR_WITHOUT")
    with pytest.raises(PtoPatchError) as raised:  # every setting accepted: now the folder is what fails
        verify_model(options)
    assert "does not exist" in raised.value.message and "rejects" not in raised.value.message


# --- verify and bench on a patched tiny model, with the counting torchair ----------------------------

QUICK = ["--dtype", "fp32", "--warmup", "1", "--iters", "1", "--json"]


def _run(args: list[str], home: Path, *, torchair: bool = True) -> tuple[int, dict, list[dict]]:
    done, graphs = run_with_torchair(args, home, torchair=torchair)
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout), graphs


@pytest.fixture(scope="module")
def eager_texts(patched_tiny: Path, tmp_path_factory) -> tuple[str, str]:
    home = tmp_path_factory.mktemp("eager")
    code, report, _ = _run(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--output_length", "16", *QUICK], home
    )
    assert code == 0, report
    return report["accuracy"]["baseline_text"], report["accuracy"]["pto_text"]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 2])
def test_verify_acl_graph_captures_decode_once_per_mode(
    patched_tiny: Path, tmp_path: Path, batch, eager_texts
):
    code, report, graphs = _run(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--use_acl_graph", "--output_length", "16"]
        + ["--batch", str(batch), *QUICK],
        tmp_path,
    )
    assert code == 0 and report["passed"], report["failures"]
    compilation = report["compilation"]
    assert compilation["backend"] == "torchair" and compilation["cache"] == "static"
    assert compilation["captured_phases"] == ["decode"] and compilation["prefill"] == "eager"
    # what the stand-in was handed: at most 2 graphs per mode (here 1: decode; prefill runs eagerly)
    assert 1 <= len(graphs) <= 2 * 2, graphs
    assert all(g["mode"] == "reduce-overhead" for g in graphs)
    noted = [w for w in report["warnings"] if w.startswith("torchair: ")]  # what torchair warned, passed on
    assert any("npugraph_ex" in w for w in noted)  # reduce-overhead's deprecation
    # tiling_schedule_optimize is left off: torchair lists it as unsupported in reduce-overhead
    assert not any("tiling_schedule_optimize" in w for w in noted), noted
    assert all(g["frozen_parameter"] is True and g["tiling_schedule_optimize"] is False for g in graphs)
    assert "tiling_schedule_optimize is left off" in compilation["acl_graph"]["why"]
    capture = compilation["modes"]["pto"]["capture"]
    assert capture["kernels_built_during"] == 0 and capture["fallbacks_during"] == {}
    (record,) = capture["graphs"]
    assert record["primed"] is True and record["eager_calls"]
    assert record["graph_ops"] == record["eager_calls"]  # what the FX graph holds = one eager step's calls
    for name in ("baseline", "pto"):
        mode = compilation["modes"][name]
        assert mode["graphs"] <= 2 and mode["captures"] <= 2, mode
        assert list(mode["decode_graphs"].values()) == [1] and mode["timed_graphs"] == 0, mode
        assert mode["decode_steps"] >= 15  # 16 tokens: one prefill, then each step a replay
    assert sum(m["graphs"] for m in compilation["modes"].values()) == len(graphs)
    assert (report["accuracy"]["baseline_text"], report["accuracy"]["pto_text"]) == eager_texts


@pytest.mark.slow
def test_a_growing_cache_under_acl_graph_recompiles_per_step_and_fails(patched_tiny: Path, tmp_path: Path):
    code, report, graphs = _run(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--use_acl_graph", "--cache", "dynamic"]
        + ["--output_length", "8", *QUICK],  # 7 decode steps, 7 graphs a mode: enough to break the bound
        tmp_path,
    )
    assert code == 3, report
    assert len(graphs) > 2 * 2  # the bound the static cache meets, exceeded
    recompiling = [f for f in report["failures"] if "decode recompiles per step" in f]
    assert {f.split(":")[0] for f in recompiling} == {"baseline", "pto"}
    assert all("size mismatch" in f for f in recompiling), recompiling


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_verify_compiled_with_a_static_cache_meets_the_same_bound(
    patched_tiny: Path, tmp_path: Path, backend
):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    code, report, graphs = _run(
        ["verify", "--model-path", str(patched_tiny), "--use_pto", "--use_compile", "--backend", backend]
        + ["--cache", "static", "--output_length", "16", *QUICK],
        tmp_path,
        torchair=False,
    )
    assert code == 0 and report["passed"], report["failures"]
    assert graphs == []  # torchair was never asked
    compilation = report["compilation"]
    assert compilation["backend"] == backend and compilation["dynamic"] is False
    assert compilation["captured_phases"] == []  # the CPU captures nothing
    for mode in compilation["modes"].values():
        assert mode["graphs"] <= 2 and list(mode["decode_graphs"].values()) == [1], mode
    assert report["accuracy"]["token_match_rate"] == 1.0


@pytest.mark.slow
def test_bench_acl_graph_times_replays_at_every_batch_size(patched_tiny: Path, tmp_path: Path):
    code, result, graphs = _run(
        ["bench", "--model-path", str(patched_tiny), "--use_acl_graph", "--batches", "1,2"]
        + ["--output_length", "4", "--dtype", "fp32", "--warmup", "0", "--iters", "2", "--json"],
        tmp_path,
    )
    assert code == 0 and result["passed"], result["failures"]
    assert any("one untimed capture run per mode" in w for w in result["warnings"])
    for mode in result["compilation"]["modes"].values():
        assert sorted(mode["decode_graphs"]) == ["batch 1, static cache 256", "batch 2, static cache 256"]
        assert set(mode["decode_graphs"].values()) == {1} and mode["timed_graphs"] == 0, mode
    assert len(graphs) == 2 * 2  # two modes, two batch sizes: one capture each


@pytest.mark.slow
def test_a_kernel_that_reads_python_state_per_call_recompiles_per_step_and_fails(
    patched_tiny: Path, tmp_path: Path
):
    """The wrappers trace their eager route again: its call counter becomes a guard that every step fails."""
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(patched_tiny, folder, symlinks=True)
    init = folder / "pto_kernels" / "__init__.py"
    source = init.read_text(encoding="utf-8")
    assert "_tracing = torch.compiler.is_compiling" in source
    init.write_text(source.replace("_tracing = torch.compiler.is_compiling", "_tracing = lambda: False"))
    code, report, _ = _run(
        ["verify", "--model-path", str(folder), "--use_pto", "--ops", "rms_norm", "--use_acl_graph"]
        + ["--output_length", "4", "--allow-modified", *QUICK],
        tmp_path,
    )
    assert code == 3, report
    (failure,) = [f for f in report["failures"] if "decode recompiles per step" in f]
    assert failure.startswith("pto: ") and ".calls == " in failure, failure  # the counter, named
    assert report["compilation"]["modes"]["baseline"]["decode_graphs"] == {"batch 1, static cache 256": 1}


# --- the 910B projection's arithmetic ----------------------------------------------------------------


def _projection_module():
    spec = importlib.util.spec_from_file_location(
        "bench_decode_projection", REPO / "benchmarks" / "bench_decode_projection.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_projection_sums_spans_captured_and_adds_launches_eager():
    projection = _projection_module()
    soc = {"ddr_rate_bytes_per_cycle": 32, "ai_core_cnt": 24, "cube_freq_mhz": 1850}
    spans = {"attention_prologue": 20.0, "mlp_block": 120.0, "rms_norm": 2.0, "mrope": 7.0}
    spans |= {"swiglu_mlp": 125.0, "linear_2048_2048": 10.0, "linear_2048_256": 8.0, "linear_lm_head": 350.0}
    spans |= {"attention_core_1024": 22.0, "attention_core_4096": 30.0}  # the simulated core per context
    spans |= {"kv_cache_write": 1.5}  # the proxy for the kernels of the step that are torch's
    # the prologue a captured step runs over the static cache: the one that writes it (not the plain one)
    spans |= {"attention_prologue_cached": 21.0}
    out = projection.project(
        spans, context=1024, launch_us=10.0, launches={"blocks": 200, "baseline": 1000}, soc=soc
    )
    assert not [key for key in out if "estimate" in key]  # every kernel simulated
    attention = out["attention_core_us_per_layer"]
    assert attention == 22.0
    kv_us = 2 * 2 * 128 * 1024 * 2 / (32 * 24 * 1850)  # K and V of 2 heads x 128, 1,024 positions, bf16
    assert out["attention_core_kv_floor_us_per_layer"] == pytest.approx(kv_us, abs=0.01)
    blocks = out["variants"]["fused"]
    captured_us = 36 * (141.0 + attention) + 2.0 + 350.0
    assert blocks["captured_ms"] == pytest.approx(captured_us / 1e3, abs=1e-3)
    assert blocks["modeled_kernels"] == 36 * 3 + 2
    assert blocks["eager_modeled_launches_ms"] == pytest.approx((captured_us + 110 * 10.0) / 1e3, abs=1e-3)
    assert blocks["eager_all_launches_ms"] == pytest.approx((captured_us + 200 * 10.0) / 1e3, abs=1e-3)
    # the 90 kernels of the 200 not modeled, apart from the headline, each at the proxy's span
    assert blocks["other_kernels"] == 90
    assert blocks["captured_with_others_ms"] == pytest.approx((captured_us + 90 * 1.5) / 1e3, abs=1e-3)
    assert out["captured_blocks_with_others_over_weight_floor"] > out["captured_blocks_over_weight_floor"]
    per_op = out["variants"]["per_op"]
    assert per_op["layer_kernels_us"] == pytest.approx(2 * 2.0 + 2 * 10.0 + 2 * 8.0 + 7.0 + 125.0)
    assert out["baseline_launches_only_ms"] == pytest.approx(10.0)
    assert 4.0 < out["weight_floor_ms"] < 4.8  # about 6.2 GB at about 1.42 TB/s
    kv_floor_ms = 36 * kv_us / 1e3
    assert out["weight_and_kv_floor_ms"] == pytest.approx(out["weight_floor_ms"] + kv_floor_ms, abs=2e-3)
    assert out["captured_blocks_over_weight_floor"] == pytest.approx(
        blocks["captured_ms"] / out["weight_floor_ms"], abs=2e-3
    )
    at_4096 = projection.project(spans, 4096, 10.0, {"blocks": 200, "baseline": 1000}, soc)
    assert at_4096["variants"]["fused"]["captured_ms"] == pytest.approx(
        (captured_us + 36 * 8.0) / 1e3, abs=1e-3
    )
    at_batch_8 = projection.project(spans, 1024, 10.0, {"blocks": 200, "baseline": 1000}, soc, batch=8)
    # every sequence's K and V: 8 caches' floor; the weights once whatever the batch; 8 tokens a step
    assert at_batch_8["attention_core_kv_floor_us_per_layer"] == pytest.approx(8 * kv_us, abs=0.01)
    assert at_batch_8["weight_and_kv_floor_ms"] == pytest.approx(
        out["weight_floor_ms"] + 8 * kv_floor_ms, abs=2e-3
    )
    # at a batch the package's cached prologue writes every sequence's k and v at B rows: its span (simulated at
    # 8 rows), no cache update of torch's, 3 kernels a layer as at batch 1
    batch_8 = at_batch_8["variants"]["fused"]
    batch_8_us = 36 * (21.0 + 120.0 + attention) + 2.0 + 350.0
    assert batch_8["captured_ms"] == pytest.approx(batch_8_us / 1e3, abs=1e-3)
    assert batch_8["modeled_kernels"] == 36 * 3 + 2
    assert batch_8["eager_all_launches_ms"] == pytest.approx((batch_8_us + 200 * 10.0) / 1e3, abs=1e-3)
    assert batch_8["other_kernels"] == 90
    # past the batches it takes (16 sequences) the plain prologue at B rows, then torch's two index_copy_
    # and the length's add_, each at the proxy's span: three more kernels a layer
    batch_17 = projection.project(spans, 1024, 10.0, {"blocks": 200, "baseline": 1000}, soc, batch=17)
    batch_17 = batch_17["variants"]["fused"]
    batch_17_us = 36 * (20.0 + 120.0 + 3 * 1.5 + attention) + 2.0 + 350.0
    assert batch_17["captured_ms"] == pytest.approx(batch_17_us / 1e3, abs=1e-3)
    assert batch_17["modeled_kernels"] == 36 * 6 + 2
    assert batch_17["eager_all_launches_ms"] == pytest.approx(
        (batch_17_us + (200 + 108) * 10.0) / 1e3, abs=1e-3
    )
    assert at_batch_8["captured_blocks_tokens_per_s"] == pytest.approx(8e3 / batch_8["captured_ms"], rel=1e-3)
    assert out["captured_blocks_tokens_per_s"] == pytest.approx(1e3 / blocks["captured_ms"], rel=1e-3)


def test_the_projection_simulates_the_core_at_each_batch_one_row_a_sequence():
    projection = _projection_module()
    kernels = projection.kernels_to_simulate(rows=8, contexts=(1024, 4096))
    cores = [params for op, params in kernels if op == "attention_core"]
    assert cores == [{"rows": 1, "context": 1024, "batch": 8}, {"rows": 1, "context": 4096, "batch": 8}]
    assert all(params["rows"] == 8 for op, params in kernels if op != "attention_core")
    # the cached prologue at every batch up to 16, at its B rows; past it the plain one and the cache update
    for rows in (1, 8, 16):
        cached = [
            p for op, p in projection.kernels_to_simulate(rows=rows) if op == "attention_prologue_cached"
        ]
        assert cached == [{"rows": rows, "context": 1024}], rows
    past = [op for op, _ in projection.kernels_to_simulate(rows=17)]
    assert "attention_prologue_cached" not in past and {"attention_prologue", "kv_cache_write"} <= set(past)


# --- tune measures replays too --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tuned_tiny(tmp_path_factory) -> Path:
    """A patched tiny folder of its own: tune writes its tuning file into the folder."""
    from pto_patch.patching import engine
    from pto_patch.tiny.model import make_tiny

    folder = tmp_path_factory.mktemp("tune") / "GutenOCR-tiny"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    return folder


TUNE_QUICK = ["--ops", "rms_norm", "--kernel-backend", "fused", "--batches", "1", "--output_length", "6"]
TUNE_QUICK += ["--warmup", "0", "--iters", "2", "--budget-s", "300", "--dtype", "fp32", "--json"]


@pytest.mark.slow
def test_tune_under_acl_graph_measures_replays_of_one_capture_per_candidate(tuned_tiny: Path, tmp_path: Path):
    code, result, graphs = _run(
        ["tune", "--model-path", str(tuned_tiny), "--use_acl_graph", *TUNE_QUICK], tmp_path
    )
    assert code == 0 and result["passed"], result["failures"]
    assert any("one untimed capture run per candidate" in w for w in result["warnings"])  # --warmup 0 raised
    compilation = result["compilation"]
    assert compilation["cache"] == "static" and compilation["captured_phases"] == ["decode"]
    assert set(compilation["modes"]) == {"baseline", "rms_norm=fused"}
    for mode in compilation["modes"].values():
        assert mode["timed_graphs"] == 0 and all(n <= 1 for n in mode["decode_graphs"].values()), mode
    assert len(graphs) <= 2 * 2  # two candidates at one batch size: the probe's and the warm-up's captures
    assert result["tuning_file"] is not None


@pytest.mark.slow
def test_tune_whose_decode_recompiles_per_step_fails_and_writes_no_tuning(tmp_path: Path):
    from pto_patch.patching import engine
    from pto_patch.tiny.model import make_tiny

    folder = tmp_path / "GutenOCR-tiny"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    code, result, graphs = _run(
        ["tune", "--model-path", str(folder), "--use_acl_graph", "--cache", "dynamic", *TUNE_QUICK], tmp_path
    )
    assert code == 3, result
    recompiling = [f for f in result["failures"] if "decode recompiles per step" in f]
    assert recompiling and all("size mismatch" in f for f in recompiling), result["failures"]
    assert len(graphs) > 2 * 2
    assert result["tuning_file"] is None and not (folder / ".pto_patch" / "tuning.json").exists()


def test_a_release_whose_static_cache_differs_is_refused_before_the_folder_is_read(monkeypatch, tmp_path):
    import transformers

    from pto_patch.run.verify import VerifyOptions, verify_model

    options = VerifyOptions(model_path=tmp_path / "no-such-folder", use_compile=True, cache="static")
    monkeypatch.setattr(transformers, "__version__", "4.56.2")
    with pytest.raises(PtoPatchError) as raised:
        verify_model(options)
    message = raised.value.message
    assert message.startswith("transformers 4.56.2 cannot run a graph decode") and "\n" not in message
    assert "--use_acl_graph" in raised.value.hint
    monkeypatch.setattr(transformers, "__version__", "4.57.6")  # the floor: now the folder is what fails
    with pytest.raises(PtoPatchError) as raised:
        verify_model(options)
    assert "does not exist" in raised.value.message


@pytest.mark.slow
def test_the_npugraph_ex_branch_captures_once_with_frozen_parameters(
    patched_tiny: Path, tmp_path: Path, eager_texts
):
    """torch-npu 2.13.0 registers npugraph_ex: the branch torch-npu takes, with its options, captured once."""
    os.environ["COUNTING_TORCHAIR_NPUGRAPH_EX"] = "1"
    try:
        code, report, graphs = _run(
            [
                "verify",
                "--model-path",
                str(patched_tiny),
                "--use_pto",
                "--use_acl_graph",
                "--output_length",
                "16",
            ]
            + QUICK,
            tmp_path,
        )
    finally:
        del os.environ["COUNTING_TORCHAIR_NPUGRAPH_EX"]
    assert code == 0 and report["passed"], report["failures"]
    compilation = report["compilation"]
    assert compilation["acl_graph"]["kind"] == "npugraph_ex"
    assert [g["mode"] for g in graphs] == ["npugraph_ex", "npugraph_ex"] and all(
        g["frozen_parameter"] for g in graphs
    )
    for name in ("baseline", "pto"):
        mode = compilation["modes"][name]
        assert list(mode["decode_graphs"].values()) == [1] and mode["timed_graphs"] == 0, mode
    (record,) = compilation["modes"]["pto"]["capture"]["graphs"]
    assert record["graph_ops"] == record["eager_calls"] and record["fallbacks_during"] == {}
    assert (report["accuracy"]["baseline_text"], report["accuracy"]["pto_text"]) == eager_texts


@pytest.mark.slow
@pytest.mark.pypto
@pytest.mark.parametrize("warm_up", [True, False])
def test_a_pypto_kernel_built_inside_the_capture_fails_and_the_warm_up_prevents_it(
    patched_tiny: Path, tmp_path: Path, warm_up: bool
):
    """The stand-in captures on the first call (as npugraph_ex and reduce-overhead do): a PyPTO kernel not
    built before it raises CompileDuringCaptureError there and falls back; the eager step before each
    capture builds it first."""
    pytest.importorskip("pypto")
    if not warm_up:
        os.environ["PTO_PATCH_CAPTURE_WITHOUT_WARMUP"] = "1"
    try:
        code, report, _ = _run(
            ["verify", "--model-path", str(patched_tiny), "--use_pto", "--use_acl_graph", "--ops", "rms_norm"]
            + ["--kernel-backend", "pypto", "--output_length", "4", "--dtype", "fp32", "--warmup", "0"]
            + ["--iters", "1", "--json"],
            tmp_path,
        )
    finally:
        os.environ.pop("PTO_PATCH_CAPTURE_WITHOUT_WARMUP", None)
    capture = report["compilation"]["modes"]["pto"]["capture"]
    if warm_up:
        assert code == 0 and report["passed"], report["failures"]
        assert capture["kernels_built_before"] >= 1 and capture["kernels_built_during"] == 0
        assert capture["fallbacks_during"] == {}
        return
    assert code == 3, report
    assert capture["kernels_built_before"] == 0 and capture["fallbacks_during"].get("rms_norm", 0) > 0
    (failure,) = [f for f in report["failures"] if "inside the capture" in f]
    assert failure.startswith("pto: rms_norm fell back") and "batch 1, static cache 256" in failure


def test_a_capture_that_built_or_fell_back_names_the_op_and_the_capture():
    from pto_patch.run.graph.compiling import capture_failures
    from pto_patch.run.graph.graph_decode import CaptureRecord

    record = CaptureRecord(
        key="batch 1, static cache 256", switches="rms_norm=pypto", primed=False, built_before=0,
        built_during={"mlp_block": 2}, fallbacks_during={"mlp_block": 2, "rms_norm": 5},
        eager_calls={}, graph_ops=None,
    )  # fmt: skip
    failures = capture_failures("pto", [record])
    assert failures == [
        "pto: mlp_block built 2 PyPTO kernel(s) inside the capture of batch 1, static cache 256: "
        "on a device that compile fails and the graph replays the torch fallback",
        "pto: rms_norm fell back 5 time(s) inside the capture of batch 1, static cache 256: "
        "the graph replays the torch fallback, not the kernel",
    ]
    clean = CaptureRecord("k", "", True, 3, {}, {}, {"rms_norm": 5}, {"rms_norm": 5})
    assert capture_failures("pto", [clean]) == []


@pytest.mark.parametrize("stand_in", ["counting", "skewing"])
def test_verify_acl_graph_is_judged_against_the_eager_model(
    stand_in: str, patched_tiny: Path, tmp_path: Path
):
    """A fault the graph brings to both of its runs (the skewing stand-in's bias from each graph's third
    call) fails verify naming the mode; the counting stand-in (no fault) passes, with the eager tokens."""
    done, _ = run_with_torchair(
        ["verify", "--model-path", str(patched_tiny), "--use_acl_graph", "--output_length", "12", *QUICK],
        tmp_path,
        stand_in=SKEWING_TORCHAIR if stand_in == "skewing" else COUNTING_TORCHAIR,
    )
    report = json.loads(done.stdout)
    if stand_in == "counting":
        assert done.returncode == 0, report["failures"]
        assert report["mode"] == "ACL graph" and report["judged"]["baseline"]["passed"]
        assert report["accuracy"]["pto_text"] == report["reference"]["text"]
        return
    assert done.returncode == 3
    assert not report["judged"]["baseline"]["passed"]
    assert report["judged"]["baseline"]["first_failing_step"] >= 1  # decode only: the prefill is eager
    assert any(
        line.startswith("baseline (ACL graph)") and "not a kernel's" in line for line in report["failures"]
    )


def test_the_projection_counts_a_span_below_its_byte_floor_at_the_floor():
    projection = _projection_module()
    assert projection.at_byte_floor({"us": 346.82, "floor_us": 438.0}) == 438.0  # the lm_head's
    assert projection.at_byte_floor({"us": 112.5, "floor_us": 95.0}) == 112.5
