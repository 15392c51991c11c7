"""Wall time of `apply`, `restore`, `status` and `--help`, as a user runs them, and of the engine alone.

Whole process: each round copies a make-tiny folder (no modeling code of its own, so apply rewrites
the installed transformers' real files, as for GutenOCR-3B) and runs the `pto-patch` command on it:

- apply, first: with an empty rewrite cache (a release pto-patch has not rewritten before);
- apply, seen: with the cache the first apply filled (the same release, spec, templates, version);
- status on the patched folder, restore, and `pto-patch --help`.

The commands run as an installed pto-patch does, with its bytecode cached (after one warm-up run),
even where PYTHONDONTWRITEBYTECODE is set in this shell.

Engine only: `engine.apply_patch` (without the cache) and `engine.restore_model` in this process, as
this benchmark measured before. Prints medians over the rounds (wall time, and the commands' CPU
time, which another load on the machine sways less); the targets are the issue's, in wall time.

    python benchmarks/bench_apply.py [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (name, target in seconds); whole-process figures, medians
TARGETS = {
    "apply_first_s": 1.0,
    "apply_seen_s": 0.4,
    "restore_s": 0.3,
    "status_s": 0.2,
    "help_s": 0.2,
}


def command_line() -> list[str]:
    """The installed `pto-patch` script beside this interpreter, else `python -m pto_patch`."""
    script = Path(sys.executable).parent / "pto-patch"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "pto_patch"]


CPU_S: dict[str, list[float]] = {}  # user + system seconds of each command: less swayed by other load


def timed(name: str, args: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    CPU_S.setdefault(name, []).append(cpu)
    return elapsed


def installed_env(work: Path) -> dict[str, str]:
    """The environment of an installed pto-patch: bytecode cached (pip compiles it at install), in a
    folder of this run's, even where PYTHONDONTWRITEBYTECODE is set here."""
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(work / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def whole_process(template: Path, work: Path, rounds: int) -> dict[str, list[float]]:
    cli = command_line()
    times: dict[str, list[float]] = {name: [] for name in TARGETS}
    warm = work / "warm-up"  # fills the bytecode cache; its own rewrite cache, so no apply below is helped
    shutil.copytree(template, warm)
    for args in (["--help"], ["apply", "--model-path", str(warm)], ["restore", "--model-path", str(warm)]):
        timed("warm-up", [*cli, *args], {**installed_env(work), "PTO_PATCH_CACHE": str(work / "warm-cache")})
    for round_index in range(rounds):
        cache = work / f"cache{round_index}"  # empty: the first apply of this round rewrites
        env = {**installed_env(work), "PTO_PATCH_CACHE": str(cache)}
        first, seen = work / f"first{round_index}", work / f"seen{round_index}"
        for folder in (first, seen):
            shutil.copytree(template, folder)
        runs = {
            "apply_first_s": ["apply", "--model-path", str(first)],
            "apply_seen_s": ["apply", "--model-path", str(seen)],
            "status_s": ["status", "--model-path", str(seen)],
            "restore_s": ["restore", "--model-path", str(seen)],
            "help_s": ["--help"],
        }
        for name, args in runs.items():
            times[name].append(timed(name, [*cli, *args], env))
        for folder in (first, seen, cache):
            shutil.rmtree(folder, ignore_errors=True)
    return times


def engine_only(template: Path, work: Path, rounds: int) -> dict[str, list[float]]:
    from pto_patch import engine

    times: dict[str, list[float]] = {"engine_apply_s": [], "engine_restore_s": []}
    for round_index in range(rounds):
        folder = work / f"engine{round_index}"
        shutil.copytree(template, folder)
        started = time.perf_counter()
        engine.apply_patch(model_path=folder, use_cache=False)
        times["engine_apply_s"].append(time.perf_counter() - started)
        started = time.perf_counter()
        engine.restore_model(model_path=folder)
        times["engine_restore_s"].append(time.perf_counter() - started)
        shutil.rmtree(folder)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    from pto_patch.locate import installed_transformers_release
    from pto_patch.tiny_model import make_tiny

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        template = work / "tiny"
        make_tiny(template)
        times = whole_process(template, work, args.rounds)
        times.update(engine_only(template, work, args.rounds))
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "transformers": installed_transformers_release(),
        "rounds": args.rounds,
        "command": " ".join(command_line()),
        "medians_s": medians,
        "cpu_medians_s": {
            name: statistics.median(values) for name, values in CPU_S.items() if name in TARGETS
        },
        "targets_s": TARGETS,
        "runs_s": times,
    }
    print(
        f"transformers {result['transformers']}, {args.rounds} rounds, medians (whole process unless noted)"
    )
    for name, median in medians.items():
        target = TARGETS.get(name)
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        goal = f"target <= {target:.1f} s" if target is not None else "in process"
        cpu = f"cpu {result['cpu_medians_s'][name]:.3f} s, " if name in TARGETS else ""
        print(f"  {name.removesuffix('_s'):<16} {median:7.3f} s   ({cpu}{spread}; {goal})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
