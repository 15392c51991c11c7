"""The first hour with pto-patch: the mistakes a new user makes, run as they type them, and the answers.

Each case is a command line from a first session on a small folder (a config.json and a tokenizer
are enough for apply, restore and status; runs that load a model are in test_verify.py and
test_bench.py). Every test holds a case that fails without the behaviour it checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pto_patch.cli.app import main
from pto_patch.errors import EXIT_OK, EXIT_USAGE
from pto_patch.patching import engine
from pto_patch.patching.restore import restore_model
from tests.folder_snapshot import snapshot
from tests.helpers.folders import HUB_CONFIG, write_config


def cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code


def json_cli(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli(*args, "--json")
    return code, json.loads(capsys.readouterr().out)


def edit(folder: Path, text: str) -> None:
    modeling = folder / "modeling_qwen2_5_vl.py"
    modeling.write_text(modeling.read_text() + f"\n# {text}\n")


# --- no lost edit -----------------------------------------------------------------------------------


def test_a_second_forced_restore_keeps_the_first_edit_too(model_folder: Path, capsys):
    engine.apply_patch(model_path=model_folder)
    edit(model_folder, "first edit")
    assert cli("restore", "--model-path", str(model_folder), "--force") == EXIT_OK
    engine.apply_patch(model_path=model_folder)
    edit(model_folder, "second edit")
    code, restored = json_cli(capsys, "restore", "--model-path", str(model_folder), "--force")
    assert code == EXIT_OK
    assert restored["kept_edited"] == ["modeling_qwen2_5_vl.py.edited.2"]
    assert "# first edit" in (model_folder / "modeling_qwen2_5_vl.py.edited").read_text()
    assert "# second edit" in (model_folder / "modeling_qwen2_5_vl.py.edited.2").read_text()
    code, status = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert status["kept_edits"] == ["modeling_qwen2_5_vl.py.edited", "modeling_qwen2_5_vl.py.edited.2"]
    capsys.readouterr()
    cli("status", "--model-path", str(model_folder))
    assert "modeling_qwen2_5_vl.py.edited.2" in " ".join(capsys.readouterr().out.split())


# --- nothing left behind unnamed ----------------------------------------------------------------------


def test_status_and_restore_name_files_neither_the_checkpoint_nor_the_patch_put_there(
    model_folder: Path, capsys
):
    (model_folder / "model.safetensors").write_bytes(b"weights")
    (model_folder / "README.md").write_text("card")
    engine.apply_patch(model_path=model_folder)
    (model_folder / "bench_baseline.json").write_text("{}")  # what an old bench wrote into the cwd
    (model_folder / "scratch").mkdir()
    code, status = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert status["unexpected"] == ["bench_baseline.json", "scratch/"]
    code, restored = json_cli(capsys, "restore", "--model-path", str(model_folder))
    assert code == EXIT_OK and restored["unexpected"] == ["bench_baseline.json", "scratch/"]
    assert (model_folder / "bench_baseline.json").exists()  # named, never deleted
    code, status = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert status["unexpected"] == ["bench_baseline.json", "scratch/"]
    (model_folder / "bench_baseline.json").unlink()
    (model_folder / "scratch").rmdir()
    assert json_cli(capsys, "status", "--model-path", str(model_folder))[1]["unexpected"] == []


def test_a_downloaded_folder_counts_its_recorded_files_as_the_checkpoint(model_folder: Path, capsys):
    (model_folder / "odd-shard.bin2").write_bytes(b"x")
    record = {"repo_id": "rootsautomation/GutenOCR-3B", "files": {"odd-shard.bin2": 1, "config.json": 1}}
    (model_folder / ".pto_patch_download.json").write_text(json.dumps(record))
    (model_folder / "notes.txt").write_text("mine")
    assert json_cli(capsys, "status", "--model-path", str(model_folder))[1]["unexpected"] == ["notes.txt"]


# --- restore twice --------------------------------------------------------------------------------


def test_restore_of_an_unpatched_folder_is_a_no_op_that_exits_0(model_folder: Path, capsys):
    before = snapshot(model_folder)
    assert restore_model(model_path=model_folder).not_patched
    capsys.readouterr()
    assert cli("restore", "--model-path", str(model_folder)) == EXIT_OK
    assert "is not patched; nothing to restore" in capsys.readouterr().out
    engine.apply_patch(model_path=model_folder)
    assert cli("restore", "--model-path", str(model_folder)) == EXIT_OK
    assert cli("restore", "--model-path", str(model_folder)) == EXIT_OK  # a trap's second restore
    assert snapshot(model_folder) == before
    code, document = json_cli(capsys, "restore", "--model-path", str(model_folder))
    assert code == EXIT_OK and document["not_patched"] is True and document["restored"] == []


def test_a_restore_of_no_model_folder_still_fails(tmp_path: Path, capsys):
    assert cli("restore", "--model-path", str(tmp_path / "nowhere")) == 1
    assert cli("restore", "--model-path", str(tmp_path)) == 1  # no config.json: not a model folder


# --- reports in a place of their own ------------------------------------------------------------------


def test_run_reports_go_to_the_users_cache_never_a_hub_cache(tmp_path: Path, monkeypatch):
    from pto_patch.errors import PtoPatchError
    from pto_patch.run.report_folder import reports_root, run_reports_place

    monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "tiny"
    first = run_reports_place("bench", model, None, "--output-dir")
    assert first.path.parent == reports_root() == tmp_path / "cache" / "reports"
    made = first.make(), first.make()  # two runs in one second: two folders
    assert made[0] != made[1] and all(path.is_dir() and path.parent == reports_root() for path in made)
    asked = tmp_path / "reports-here"
    assert run_reports_place("bench", model, asked, "--output-dir").make() == asked  # asked for: as asked
    snapshot_dir = tmp_path / "hub" / "models--o--n" / "snapshots" / "abc"
    snapshot_dir.mkdir(parents=True)
    with pytest.raises(PtoPatchError) as refused:
        run_reports_place("bench", snapshot_dir, snapshot_dir, "--output-dir")
    message = refused.value.message  # the model folder itself: the write-target rule refuses it first
    assert refused.value.exit_code == EXIT_USAGE and "lies in the model folder" in message
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(PtoPatchError):
        run_reports_place("bench", model, tmp_path / "hub" / "elsewhere", "--output-dir")
    monkeypatch.setenv("PTO_PATCH_CACHE", str(tmp_path / "hub" / "mine"))  # a default there too
    with pytest.raises(PtoPatchError):
        run_reports_place("bench", model, None, "--output-dir")


# --- first mistakes answered ----------------------------------------------------------------------


def test_the_hub_id_the_readme_names_is_the_spec(model_folder: Path, capsys):
    code, status = json_cli(
        capsys, "status", "--model", "rootsautomation/GutenOCR-3B", "--model-path", str(model_folder)
    )
    assert code == EXIT_OK and status["spec"] == "gutenocr_3b"
    code, error = json_cli(capsys, "status", "--model", "nobody/nothing", "--model-path", str(model_folder))
    assert code == EXIT_USAGE and "hub id" in error["hint"]


def test_a_folder_given_to_model_names_model_path(model_folder: Path, capsys, monkeypatch):
    code, error = json_cli(capsys, "status", "--model", str(model_folder))
    assert code == EXIT_USAGE and "is a folder" in error["error"]
    assert error["hint"] == f"pass the model folder as --model-path {model_folder}"
    monkeypatch.chdir(model_folder.parent)  # the bare name of a folder here, too
    code, error = json_cli(capsys, "status", "--model", model_folder.name)
    assert code == EXIT_USAGE and f"--model-path {model_folder.name}" in error["hint"]


def test_config_json_given_as_the_model_path_names_its_folder(model_folder: Path, capsys):
    code, error = json_cli(capsys, "status", "--model-path", str(model_folder / "config.json"))
    assert code == 1 and "is a file" in error["error"]
    assert error["hint"] == f"pass its folder: --model-path {model_folder}"


def test_a_hub_cache_repo_folder_points_to_its_snapshot(tmp_path: Path, capsys):
    repo = tmp_path / "hub" / "models--rootsautomation--GutenOCR-3B"
    snapshot_dir = repo / "snapshots" / "0123abc"
    snapshot_dir.mkdir(parents=True)
    (repo / "blobs").mkdir()
    write_config(snapshot_dir, HUB_CONFIG)
    code, error = json_cli(capsys, "status", "--model-path", str(repo))
    assert code == 1 and "cache repo folder" in error["error"]
    assert error["hint"] == f"pass one of its snapshots: --model-path {snapshot_dir}"


def test_an_in_place_apply_on_a_cache_snapshot_suggests_overlay(tmp_path: Path, capsys):
    snapshot_dir = tmp_path / "hub" / "models--o--n" / "snapshots" / "0123abc"
    snapshot_dir.mkdir(parents=True)
    write_config(snapshot_dir, HUB_CONFIG)
    capsys.readouterr()
    assert cli("apply", "--model-path", str(snapshot_dir)) == EXIT_OK
    err = " ".join(capsys.readouterr().err.split())
    assert "is a Hugging Face cache snapshot" in err and "--overlay DIR" in err
    cli("restore", "--model-path", str(snapshot_dir))
    plain = tmp_path / "plain"
    plain.mkdir()
    write_config(plain, HUB_CONFIG)
    capsys.readouterr()
    assert cli("apply", "--model-path", str(plain)) == EXIT_OK
    assert "--overlay" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("apply", "./tiny"), "pass the model folder as --model-path ./tiny"),
        (("status", "./tiny"), "pass the model folder as --model-path ./tiny"),
        (("bench", "--use_pto"), "bench always runs the kernels off and on: drop --use_pto"),
        (("verify", "--batches", "1,4"), "verify runs one batch size: --batch N"),
    ],
)
def test_a_first_usage_mistake_gets_a_hint(args, hint, capsys):
    assert cli(*args) == EXIT_USAGE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hint: ") and hint in last
    code, error = json_cli(capsys, *args)
    assert code == EXIT_USAGE and hint in error["hint"] and error["command"] == args[0]


def test_dash_h_is_help_everywhere(capsys):
    for args in ((), ("apply",), ("verify",), ("skill", "install")):
        with pytest.raises(SystemExit) as done:
            main([*args, "-h"])
        assert done.value.code in (0, None), args
        assert capsys.readouterr().out.startswith("Usage: pto-patch"), args


def test_help_lists_each_command_by_its_whole_first_sentence(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    listing = " ".join(capsys.readouterr().out.split("Commands:")[1].split())
    assert "..." not in listing
    assert (
        "Run the patched model with the kernels off, then on; check it computes the same, and time it."
        in listing
    )


def test_the_edit_hints_name_restore_force_and_the_kept_copy(model_folder: Path, capsys):
    from pto_patch.errors import PtoPatchError
    from pto_patch.patching.folder_check import check_folder

    engine.apply_patch(model_path=model_folder)
    edit(model_folder, "mine")
    with pytest.raises(PtoPatchError) as refused:
        check_folder(model_folder, use_pto=True, allow_modified=False)
    assert f"pto-patch restore --model-path {model_folder} --force" in refused.value.hint
    assert "modeling_qwen2_5_vl.py.edited" in refused.value.hint
    (model_folder / "modeling_qwen2_5_vl.py.edited").write_text("an earlier kept copy")
    code, error = json_cli(capsys, "apply", "--model-path", str(model_folder))
    assert code == 4 and "--force" in error["hint"] and "modeling_qwen2_5_vl.py.edited.2" in error["hint"]


# --- one exit code per kind of mistake ------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("verify", "--dtype", "fp8"),
        ("verify", "--kernel-backend", "cuda"),
        ("verify", "--ops", "layernorm"),
        ("bench", "--ops", "layernorm"),
        ("apply", "--ops", "layernorm"),
        ("apply", "--model", "qwen9"),
    ],
)
def test_a_bad_option_value_exits_2(model_folder: Path, args, capsys):
    code, error = json_cli(capsys, *args, "--model-path", str(model_folder))
    assert code == EXIT_USAGE == error["exit_code"], error


# --- smaller ------------------------------------------------------------------------------------------


def test_a_dry_run_of_a_patched_folder_says_dry_run(model_folder: Path, capsys):
    engine.apply_patch(model_path=model_folder)
    code, document = json_cli(capsys, "apply", "--model-path", str(model_folder), "--dry-run")
    assert code == EXIT_OK and document["already_applied"] and document["dry_run"] is True


def test_a_dry_run_diffs_an_added_modeling_file_against_its_source(model_folder: Path, capsys):
    from pto_patch.model.locate import installed_transformers_dir

    source = installed_transformers_dir() / "models" / "qwen2_5_vl" / "modeling_qwen2_5_vl.py"
    capsys.readouterr()
    assert cli("apply", "--model-path", str(model_folder), "--dry-run") == EXIT_OK
    diff = capsys.readouterr().out
    assert f"--- {source}\n+++ b/modeling_qwen2_5_vl.py" in diff and "--- /dev/null" not in diff
    added = [line for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert len(added) < len(source.read_text().splitlines()) / 2  # the rewrite's lines, not the whole file


def test_status_text_says_the_state_its_json_says(model_folder: Path, capsys):
    engine.apply_patch(model_path=model_folder)
    code, document = json_cli(capsys, "status", "--model-path", str(model_folder))
    cli("status", "--model-path", str(model_folder))
    assert document["state"] == "complete" and f"patched ({document['state']})" in capsys.readouterr().out


def test_an_interrupted_json_run_still_prints_one_document(model_folder: Path, capsys, monkeypatch):
    from pto_patch.patching import folder_status

    def interrupted(**_):
        raise KeyboardInterrupt

    monkeypatch.setattr(folder_status, "model_status", interrupted)
    code, document = json_cli(capsys, "status", "--model-path", str(model_folder))
    assert code == 130 == document["exit_code"] and document["error"] == "interrupted"
    assert document["command"] == "status"


def test_make_tiny_weights_are_as_readable_as_its_other_files(tmp_path: Path):
    from pto_patch.tiny.model import make_tiny

    make_tiny(tmp_path / "tiny")
    config_mode = (tmp_path / "tiny" / "config.json").stat().st_mode & 0o777
    shards = sorted((tmp_path / "tiny").glob("*.safetensors"))
    assert shards and {shard.stat().st_mode & 0o777 for shard in shards} == {config_mode}


# --- numbers with their noise -------------------------------------------------------------------------


def _metrics(latencies: list[float], batch: int = 1):
    from pto_patch.run.report import ModeMetrics

    mean = sum(latencies) / len(latencies)
    return ModeMetrics(
        load_s=1.0,
        latency_s=mean,
        tokens=8,
        tokens_per_s=8 / mean,
        peak_memory_mb=10.0,
        batch=batch,
        new_tokens_per_sequence=8,
        latencies_s=latencies,
        prefill_s=0.1,
        decode_step_s=0.0001,
    )


def _bench(base: list[float], pto: list[float], ops: dict | None = None, switched_on=("rms_norm",)):
    from pto_patch.run.report import BatchRun, BenchResult, LoadInfo, ModeRun

    runs = [BatchRun(1, ModeRun(_metrics(base)), ModeRun(_metrics(pto), ops or {}), switched_on, None)]
    return BenchResult(
        model_path="m",
        device="cpu",
        dtype="float32",
        versions={},
        input={"kind": "text"},
        load_info=LoadInfo([], [], [], True),
        weight_bytes_per_token=1000,
        copy_bandwidth_bytes_s=1e9,
        peak_memory_source="rss",
        runs=runs,
    )


def test_a_ratio_comes_with_its_noise_band_and_says_within_noise_or_too_few():
    from pto_patch.run.noise import FASTER, TOO_FEW, WITHIN_NOISE, describe, speed_band

    one = speed_band([1.0], [0.4])  # `bench --iters 1`: "+150 %" from one pair of runs
    assert one.verdict == TOO_FEW and "too few to tell" in describe(one) and "--iters 3" in describe(one)
    noisy = speed_band([1.0, 1.0, 1.0, 1.0, 1.0], [0.5, 1.6, 0.9, 1.3, 0.7])
    assert noisy.low < 1.0 < noisy.high and noisy.verdict == WITHIN_NOISE
    steady = speed_band([1.0, 1.02, 0.99, 1.01, 1.0], [0.8, 0.81, 0.8, 0.79, 0.8])
    assert steady.low > 1.0 and steady.verdict == FASTER and describe(steady).endswith(FASTER)
    document = _bench([1.0, 1.0, 1.0], [0.5, 1.6, 0.9]).to_json()
    assert document["runs"][0]["speed"]["verdict"] == WITHIN_NOISE


def test_bench_text_gives_the_band_and_no_percentage_between_equal_figures(capsys):
    from pto_patch.cli import render

    render.show(_bench([0.5], [0.2]), as_json=False)
    text = capsys.readouterr().out
    assert "batch 1: PTO speed / baseline, per timed round: 2.50x (1 timed run(s): too few to tell" in text
    floor_row = next(line for line in text.splitlines() if "bandwidth floor / step" in line)
    assert "same as shown" in floor_row and "%" not in floor_row  # 0.0001 vs 0.0001


def test_a_ratio_is_never_shown_as_the_gain_of_an_op_that_never_ran(capsys):
    from pto_patch.cli import render
    from pto_patch.run.report import OpReport

    ops = {"rms_norm": OpReport(True, "fused", 4, 0), "swiglu_mlp": OpReport(True, None, 0, 0)}
    render.show(_bench([1.0, 1.0, 1.0], [0.6, 0.6, 0.7], ops), as_json=False)
    line = next(line for line in capsys.readouterr().out.splitlines() if "per timed round" in line)
    assert "no gain of swiglu_mlp: switched on, never ran" in line and "rms_norm" not in line


def test_no_ratio_is_shown_as_a_gain_when_nothing_was_switched_on(capsys):
    """`bench --use_dynamic_config` that switches nothing on: both modes ran the same code, and the order
    they ran in (the first paying for what the second reuses) showed as "2.00x"."""
    from pto_patch.cli import render
    from pto_patch.run.noise import NOTHING_ON

    first_pays = ([2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 1.0, 1.0])
    document = _bench(*first_pays, switched_on=()).to_json()
    assert document["runs"][0]["speed"] == {
        "median": None,
        "low": None,
        "high": None,
        "rounds": 4,
        "verdict": NOTHING_ON,
    }
    render.show(_bench(*first_pays, switched_on=()), as_json=False)
    line = next(line for line in capsys.readouterr().out.splitlines() if "per timed round" in line)
    assert "no ratio: nothing was switched on" in line and "2.00x" not in line
    assert _bench(*first_pays).to_json()["runs"][0]["speed"]["median"] == 2.0  # with an op on: the ratio


def test_bench_ocr_gives_each_page_its_noise_band_and_no_ratio_with_nothing_on(capsys):
    from pto_patch.cli import ocr_render
    from pto_patch.run.ocr.report import PageBenchResult, PageRun
    from pto_patch.run.report import LoadInfo

    def run(mode, latencies):
        return PageRun("prose", 1, mode, 10, 20, 8, 0.1, 0.1, 0.2, 0.3, latencies[0], 0.01, latencies)

    runs = [run("baseline", [1.0, 1.02, 0.99, 1.01, 1.0]), run("pto", [0.8, 0.81, 0.8, 0.79, 0.8])]
    load = LoadInfo([], [], [], True)
    result = PageBenchResult(
        "m", "cpu", "fp32", {}, load, "TEXT", "read", 8, [], runs=runs, switched_on=["rms_norm"]
    )
    assert result.to_json()["pto_over_baseline"][0]["speed"]["verdict"] == "faster"
    ocr_render.page_bench_text(result)
    assert "prose, batch 1: PTO speed / baseline, per timed round: 1.25x [" in capsys.readouterr().out
    result.switched_on = []
    assert result.to_json()["pto_over_baseline"][0]["speed"]["median"] is None
    ocr_render.page_bench_text(result)
    assert "no ratio: nothing was switched on" in capsys.readouterr().out


def test_every_mode_is_warmed_up_at_least_once_so_no_first_call_is_timed():
    from pto_patch.run.generation import warmup_runs

    assert [warmup_runs(n) for n in (0, 1, 5)] == [1, 1, 5]


def test_tune_states_a_verdict_that_agrees_with_its_band():
    from pto_patch.tune import selection as ts

    entry = ts.Measured(ts.Candidate.of({"rms_norm": "fused"}), tokens_per_s=[5.0, 5.0, 5.0])
    entry.ratios = [0.5, 0.6, 0.58]
    entry.band, entry.verdict = ts.band(entry.ratios), ts.UNDECIDED  # the sign test needs 5 rounds
    assert entry.band.high < 1.0
    assert entry.summary()["verdict"] == "undecided: slower by its band, not confirmed in 3 round(s)"
    entry.band = ts.band([0.5, 1.4, 0.9])
    assert entry.summary()["verdict"] == ts.UNDECIDED  # a band across 1: undecided it is


def test_a_tuned_choice_tells_patched_but_not_tuned_from_not_patched():
    from types import SimpleNamespace

    from pto_patch.run.op_choice import tuned_choice

    choice = SimpleNamespace(batch=1, ops={"rms_norm": "fused"}, decided="measured faster")
    tuning = SimpleNamespace(for_batch=lambda batch: choice, header={"ops_tuned": ["rms_norm"]})
    patched = ("rms_norm", "mrope", "swiglu_mlp", "mlp_block")
    rows = {row["op"]: row["reason"] for row in tuned_choice(tuning, 1, ("rms_norm", "swiglu_mlp"), patched)}
    assert "patched in, but not tuned" in rows["swiglu_mlp"]
    assert "not among this run's ops" in rows["mlp_block"] and "not patched" not in rows["mlp_block"]
    assert rows["residual_rms_norm"].endswith("not patched into this folder")


# --- the skill's report checker -----------------------------------------------------------------------


def _checker():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "skills" / "pto-patch" / "scripts" / "check_report.py"
    spec = importlib.util.spec_from_file_location("check_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_report_reads_bench_and_demo_reports_without_false_failures():
    from pto_patch.run.report import Accuracy, DemoResult, LoadInfo, OpReport, VerifyReport

    checker = _checker()
    ran = {"rms_norm": OpReport(True, "fused", 4, 0), "mrope": OpReport(False, None, 0, 0)}
    bench = _bench([1.0, 1.0, 1.0], [0.9, 0.9, 0.9], ran).to_json()
    assert [row for row in checker.criteria(bench) if row[0] == "FAIL"] == []
    bench["runs"][0]["pto"]["ops"]["rms_norm"]["calls"] = 0  # a real failure still is one
    assert [row[1] for row in checker.criteria(bench) if row[0] == "FAIL"] == [
        "batch 1: rms_norm: switched on and ran"
    ]

    verify = VerifyReport(
        model_path="m",
        device="cpu",
        device_reason="",
        dtype="float32",
        versions={},
        input={"kind": "text"},
        load_info=LoadInfo([], [], [], True),
        baseline=_metrics([1.0]),
        pto=_metrics([1.0]),
        ops=ran,
        accuracy=Accuracy(0.0, 0.0, 1.0, True, True, 0.1, 0.05, True, "a", "a"),
    )
    demo = DemoResult("d", False, 1.0, [], files_compared=3, hash_differences=[], verify=verify).to_json()
    assert [row for row in checker.criteria(demo) if row[0] == "FAIL"] == []
    demo["hash_differences"], demo["hashes_identical"] = ["config.json"], False
    assert [row[1] for row in checker.criteria(demo) if row[0] == "FAIL"] == [
        "folder byte-identical after restore"
    ]


def test_verify_through_vllm_compares_by_default_too():
    from pto_patch.errors import PtoPatchError
    from pto_patch.serving.vllm_verify import VllmVerifyOptions

    assert VllmVerifyOptions.from_verify({"model": "gutenocr_3b"}).use_pto is True
    assert VllmVerifyOptions.from_verify({"baseline_only": True}).use_pto is False
    with pytest.raises(PtoPatchError) as both:
        VllmVerifyOptions.from_verify({"baseline_only": True, "use_pto": True})
    assert both.value.exit_code == EXIT_USAGE
