"""`pto-patch bench`: batch parsing, the bandwidth floor's weight count, and one run on the tiny model.

Speed is never asserted here; the bench reports ratios, measured side by side in one run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pto_patch.cli import app as cli
from pto_patch.errors import EXIT_ERROR, EXIT_USAGE, PtoPatchError
from pto_patch.patching import engine
from pto_patch.patching.manifest import STATE_IN_PROGRESS, Manifest
from pto_patch.run import bench
from pto_patch.run.device import DeviceChoice
from pto_patch.tiny.model import make_tiny
from tests.helpers.cli import run_process

MODE_KEYS = {"load_s", "latency_s", "tokens", "tokens_per_s", "peak_memory_mb"}


def test_parse_batches():
    assert bench.parse_batches("1,4,8") == (1, 4, 8)
    assert bench.parse_batches(" 2 ") == (2,)
    for bad in ("", "0", "1,x", "-1"):
        with pytest.raises(PtoPatchError) as caught:
            bench.parse_batches(bad)
        assert caught.value.exit_code == EXIT_USAGE


class _Toy(torch.nn.Module):
    """Embedding, one text layer, a vision layer and an lm_head: what a decode step reads is countable."""

    def __init__(self, tied: bool):
        super().__init__()
        self.embed = torch.nn.Embedding(100, 8)
        self.layer = torch.nn.Linear(8, 8, bias=False)
        self.visual = torch.nn.Module()
        self.visual.block = torch.nn.Linear(8, 8)
        self.lm_head = torch.nn.Linear(8, 100, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.lm_head


@pytest.mark.parametrize("tied", [True, False])
def test_decode_weight_bytes_counts_text_layers_and_lm_head_once(tied):
    model = _Toy(tied).to(torch.bfloat16)
    # layer 8x8 + lm_head 100x8 at 2 bytes; never the vision block, never the untied embedding.
    assert bench.decode_weight_bytes(model) == (64 + 800) * 2


def test_copy_bandwidth_is_measured():
    assert bench.measure_copy_bandwidth(DeviceChoice("cpu", "cpu", "test"), nbytes=1 << 22) > 0


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--dtype", "int8", "--dtype 'int8' is not supported"),
        ("--kernel-backend", "cuda", "--kernel-backend 'cuda' is unknown"),
    ],
)
def test_bad_option_values_are_usage_errors_before_the_folder_is_read(
    tmp_path: Path, capsys, option: str, value: str, message: str
):
    with pytest.raises(SystemExit) as stopped:  # tmp_path holds no model: the value is checked first
        cli.main(["bench", "--model-path", str(tmp_path), option, value, "--json"])
    error = json.loads(capsys.readouterr().out)
    assert stopped.value.code == error["exit_code"] == EXIT_USAGE
    assert error["error"] == message


def test_bench_refuses_an_interrupted_apply(tmp_path: Path, capsys):
    folder = tmp_path / "tiny"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    Manifest.load(folder).with_state(STATE_IN_PROGRESS).save(folder)  # as a killed apply leaves it
    with pytest.raises(SystemExit) as stopped:
        cli.main(["bench", "--model-path", str(folder), "--batches", "1", "--output_length", "1", "--warmup",
                  "0", "--iters", "1", "--output-dir", str(tmp_path / "out"), "--json"])  # fmt: skip
    error = json.loads(capsys.readouterr().out)
    assert stopped.value.code == error["exit_code"] == EXIT_ERROR
    assert "interrupted apply" in error["error"] and "pto-patch restore" in error["hint"]
    assert not (tmp_path / "out").exists()


def test_every_bench_option_spelling_parses(monkeypatch, tmp_path: Path):
    seen = []

    def capture(options):
        seen.append(options)
        raise PtoPatchError("stopped by the test")

    monkeypatch.setattr(bench, "run_bench", capture)
    common = ["--batches", "2,3"]
    for argv in (
        ["--model_path", str(tmp_path), "--output_length", "9", "--output_dir", str(tmp_path),
         "--use_compile", "--use_acl_graph", "--use_dynamic_config", "--simple_prompt",
         "--kernel_backend", "fused", "--allow_modified"],
        ["--model-path", str(tmp_path), "--output-length", "9", "--output-dir", str(tmp_path),
         "--use-compile", "--use-acl-graph", "--use-dynamic-config", "--simple-prompt",
         "--kernel-backend", "fused", "--allow-modified"],
    ):  # fmt: skip
        with pytest.raises(SystemExit):
            cli.main(["bench", *common, *argv])
    assert len(seen) == 2 and seen[0] == seen[1]
    options = seen[0]
    assert options.batches == "2,3" and options.output_length == 9 and options.output_dir == tmp_path
    assert options.use_compile and options.use_acl_graph and options.use_dynamic_config
    assert options.kernel_backend == "fused" and options.allow_modified and options.simple_prompt
    with pytest.raises(SystemExit):
        cli.main(["bench"])
    assert (seen[-1].batches, seen[-1].output_length) == ("1,4,8", 100)


def test_bench_on_the_tiny_model_writes_both_reports(tmp_path: Path):
    folder = tmp_path / "tiny"
    make_tiny(folder)
    engine.apply_patch(model_path=folder)
    out_dir = tmp_path / "results"
    done = run_process(
        ["bench", "--model-path", str(folder), "--batches", "1,2", "--output_length", "4", "--warmup", "0",
         "--iters", "1", "--output-dir", str(out_dir), "--json"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    summary = json.loads(done.stdout)
    assert summary["passed"] and summary["command"] == "bench"
    assert [run["batch"] for run in summary["runs"]] == [1, 2]
    floor = summary["bandwidth"]
    assert floor["weight_bytes_per_token"] > 0 and floor["copy_bandwidth_gb_s"] > 0 and floor["floor_ms"] > 0
    for run in summary["runs"]:
        assert 0 < run["baseline"]["bandwidth_fraction"] and 0 < run["pto"]["bandwidth_fraction"]
        assert set(run["pto_vs_baseline_pct"]) >= {"latency_s", "tokens_per_s"}
    for name, mode in ((bench.BASELINE_FILE, "baseline"), (bench.PTO_FILE, "pto")):
        doc = json.loads((out_dir / name).read_text(encoding="utf-8"))
        assert doc["mode"] == mode and {"model_path", "device", "dtype", "versions", "schema_version"} <= set(
            doc
        )
        assert [run["batch"] for run in doc["runs"]] == [1, 2]
        for run in doc["runs"]:
            assert MODE_KEYS <= set(run)
            assert run["tokens"] == run["batch"] * 4
            if mode == "pto":
                assert all(run["ops"][op]["calls"] > 0 for op in run["switched_on"])
            else:
                assert "ops" not in run
