"""Graph and compiled runs under every transformers release of the matrix, not only the venv's own.

transformers takes the static cache under another keyword before 5.24 (`past_key_values`; `cache` from
5.24.0), and 4.57.6 refuses an unknown keyword outright: a graph run built on one release stops at the first
token on another. For each release (tests/release_envs.py), a fresh interpreter with that release first on
PYTHONPATH and the counting torchair stand-in beside it runs, through the CLI: make-tiny, apply,
`verify --use_pto --use_acl_graph` (decode captured once per mode: at most 2 graphs per mode, one per batch and
cache, none while timed, tokens equal) and `verify --use_pto --use_compile --cache static` (the same bound
under torch.compile); and graph decode of the unpatched tiny model against its eager run, token for token and
every step's logits, over both caches at batch 1 and 2 (tests/graph_against_eager.py). The venv's own release
runs the same checks in tests/test_graph_decode.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import graph_against_eager
from tests.release_envs import ENV_RELEASES, EnvUnavailable, release_env

REPO = Path(__file__).resolve().parents[1]
COUNTING_TORCHAIR = Path(__file__).resolve().parent / "counting_torchair"
FAST = ["--dtype", "fp32", "--warmup", "1", "--iters", "1", "--output_length", "8", "--json"]
TIMEOUT_S = 600


def cli(release_site: Path, home: Path, args: list[str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    log = home / "torchair.jsonl"
    log.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(release_site), str(REPO), str(COUNTING_TORCHAIR)]),
        "PYTHONNOUSERSITE": "1",
        "HF_HOME": str(home / "hf"),
        "HF_MODULES_CACHE": str(home / "hf-modules"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "COUNTING_TORCHAIR_LOG": str(log),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
    }
    for name in ("PTO_KERNELS_BACKEND", "PTO_KERNELS_STRICT", "GUTENOCR_MODEL_PATH"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "pto_patch", *args],
        capture_output=True, text=True, env=env, cwd=home, timeout=TIMEOUT_S,
    )  # fmt: skip
    graphs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, graphs


@pytest.fixture(scope="module", params=ENV_RELEASES)
def patched_under_release(request, tmp_path_factory) -> tuple[str, Path, Path]:
    release = request.param
    try:
        env = release_env(release)
    except EnvUnavailable as exc:
        pytest.skip(str(exc))
    home = tmp_path_factory.mktemp(f"graph{release}")
    folder = home / "tiny"
    for args in (["make-tiny", str(folder)], ["apply", "--model-path", str(folder), "--json"]):
        done, _ = cli(env.site, home, args)
        assert done.returncode == 0, (release, args, done.stdout[-2000:], done.stderr[-2000:])
    manifest = json.loads((folder / ".pto_patch" / "manifest.json").read_text())
    assert manifest.get("transformers_release") == release, manifest.get("transformers_release")
    return release, env.site, folder


def report_of(release: str, done: subprocess.CompletedProcess) -> dict:
    assert done.stdout.strip(), (release, done.stderr[-3000:])
    return json.loads(done.stdout)


@pytest.mark.slow
def test_graph_decode_captures_once_per_mode_under_each_release(patched_under_release, tmp_path: Path):
    release, site, folder = patched_under_release
    done, graphs = cli(
        site, tmp_path, ["verify", "--model-path", str(folder), "--use_pto", "--use_acl_graph", *FAST]
    )
    report = report_of(release, done)
    assert done.returncode == 0 and report["passed"], (release, report["failures"])
    assert report["versions"]["transformers"] == release
    compilation = report["compilation"]
    assert compilation["backend"] == "torchair" and compilation["cache"] == "static", compilation
    assert 1 <= len(graphs) <= 2 * 2, (release, graphs)  # both modes: each at most prefill and decode
    for name in ("baseline", "pto"):
        mode = compilation["modes"][name]
        assert mode["graphs"] <= 2 and list(mode["decode_graphs"].values()) == [1], (release, mode)
        assert mode["timed_graphs"] == 0 and mode["decode_steps"] >= 7, (release, mode)
    assert report["accuracy"]["token_match_rate"] == 1.0, (release, report["accuracy"])


@pytest.mark.slow
def test_compiled_static_cache_verify_meets_the_same_bound_under_each_release(
    patched_under_release, tmp_path: Path
):
    release, site, folder = patched_under_release
    done, graphs = cli(
        site,
        tmp_path,
        ["verify", "--model-path", str(folder), "--use_pto", "--use_compile", "--backend", "eager"]
        + ["--cache", "static", *FAST],
    )
    report = report_of(release, done)
    assert done.returncode == 0 and report["passed"], (release, report["failures"])
    assert graphs == []  # torchair was never asked
    for mode in report["compilation"]["modes"].values():
        assert mode["graphs"] <= 2 and list(mode["decode_graphs"].values()) == [1], (release, mode)
    assert report["accuracy"]["token_match_rate"] == 1.0, (release, report["accuracy"])


# how a run decodes: eager over transformers' growing cache, compiled over a static cache, graph decode
DECODE_MODES = {
    "eager": [],
    "compiled-static": ["--use_compile", "--backend", "eager", "--cache", "static"],
    "graph": ["--use_acl_graph"],
}


@pytest.mark.slow
@pytest.mark.parametrize("decoding", list(DECODE_MODES))
def test_the_whole_decode_layer_verifies_under_each_release(decoding, patched_under_release, tmp_path: Path):
    """`--ops all`: the blocks and the attention core (batch 1: the core takes the decode steps' attention)
    pass verify under each release, eager, compiled and as graph decode (decode captured once), on the
    backend `auto` picks here (fused: the pypto kernels themselves are run by tests/kernels)."""
    release, site, folder = patched_under_release
    done, graphs = cli(
        site,
        tmp_path,
        ["verify", "--model-path", str(folder), "--use_pto", "--ops", "all", *DECODE_MODES[decoding], *FAST],
    )
    report = report_of(release, done)
    assert done.returncode == 0 and report["passed"], (release, decoding, report["failures"])
    assert report["versions"]["transformers"] == release
    core = report["pto"]["ops"]["attention_core"]
    assert core["calls"] > 0 and core["fallbacks"] == 0, (release, decoding, core)
    assert report["accuracy"]["token_match_rate"] == 1.0, (release, decoding, report["accuracy"])
    # over the static cache (compiled, graph) the prologue writes the decode steps' k and v itself and the
    # attention skips its cache update; over the growing cache (eager) the update runs as written
    writes = report["pto"]["ops"]["attention_prologue"]["cache_writes"]
    assert (writes == 0) if decoding == "eager" else (writes > 0), (release, decoding, writes)
    if decoding == "eager":
        assert graphs == [] and not report.get("compilation"), (release, report.get("compilation"))
        return
    mode = report["compilation"]["modes"]["pto"]
    assert list(mode["decode_graphs"].values()) == [1] and mode["timed_graphs"] == 0, (release, mode)
    if decoding == "graph":
        captured = mode["capture"]["graphs"][-1]["graph_ops"]
        assert {"attention_prologue", "attention_core", "mlp_block"} <= set(captured), (release, captured)
        assert 1 <= len(graphs) <= 2 * 2, (release, graphs)
    else:
        assert graphs == []  # torchair was never asked


@pytest.mark.slow
def test_graph_decode_of_the_whole_layer_at_batch_4_writes_the_cache_under_each_release(
    patched_under_release, tmp_path: Path
):
    """`--ops all --batch 4` as graph decode: the core takes every decode step's attention and the prologue
    writes every step's k and v (each sequence's row), no fallback, under each release (4.57.6 / 5.0.0 through
    the op that leaves cache_position unmarked; 5.8+ through the one that advances the layer's length)."""
    release, site, folder = patched_under_release
    args = ["verify", "--model-path", str(folder), "--use_pto", "--ops", "all", "--batch", "4"]
    done, graphs = cli(site, tmp_path, [*args, *DECODE_MODES["graph"], *FAST])
    report = report_of(release, done)
    assert done.returncode == 0 and report["passed"], (release, report["failures"])
    ops = report["pto"]["ops"]
    core, prologue = ops["attention_core"], ops["attention_prologue"]
    assert core["calls"] > 0 and core["fallbacks"] == 0 and prologue["fallbacks"] == 0, (release, ops)
    assert prologue["cache_writes"] > 0, (release, prologue)
    assert 1 <= len(graphs) <= 2 * 2, (release, graphs)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    from pto_patch.tiny.model import make_tiny

    return make_tiny(tmp_path_factory.mktemp("unpatched") / "tiny").path


@pytest.fixture(scope="module", params=ENV_RELEASES)
def release_site(request) -> tuple[str, Path]:
    try:
        return request.param, release_env(request.param).site
    except EnvUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_graph_decode_gives_the_eager_models_tokens_and_logits_under_each_release(
    cache, release_site, tiny_folder, tmp_path: Path
):
    """The priming step before each capture leaves the cache as it found it under every release's
    bookkeeping (4.57.6 / 5.0.0 write at cache_position, 5.8.1 on advance cumulative_length, a dynamic cache
    appends): both generations of each capture key, batch 1 and 2, give the eager model's tokens and every
    step's logits within the float32 tolerance."""
    release, site = release_site
    document = graph_against_eager.run(tiny_folder, cache, (1, 2), release_site=site, home=tmp_path)
    assert document["transformers"] == release
    assert [primed for _, primed in document["captures"]] == [True, True], document["captures"]
    assert graph_against_eager.mismatches(document) == []
