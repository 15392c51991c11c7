"""Wall time of `apply`, `restore`, `status` and `--help`, as a user runs them, and of the engine alone.

Whole process: each round copies a make-tiny folder (no modeling code of its own, so apply rewrites
the installed transformers' real files, as for GutenOCR-3B) and runs the `pto-patch` command on it:

- apply, first: with an empty rewrite cache (a release pto-patch has not rewritten before);
- apply, seen: with the cache the first apply filled (the same release, spec, templates, version);
- status on the patched folder, restore, and `pto-patch --help`.

The commands run as an installed pto-patch does, with its bytecode cached (after one warm-up run),
even where PYTHONDONTWRITEBYTECODE is set in this shell.

With `--against DIR` (another checkout of pto-patch, e.g. the commit before a change), each round
also runs that checkout's commands, just before this one's: a before / after on a shared machine,
where load comes and goes between two separate runs.

Engine only: `engine.apply_patch` (without the cache) and `engine.restore_model` in this process, as
this benchmark measured before. Prints medians over the rounds (wall time, and the commands' CPU
time, which another load on the machine sways less); the targets are the issue's, in wall time.

    python benchmarks/bench_apply.py [--rounds 7] [--json out.json] [--against ../pto-patch-before]
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


AGAINST = "against "  # the prefix of the other checkout's figures (--against)


def whole_process(
    template: Path, work: Path, rounds: int, against: Path | None = None
) -> dict[str, list[float]]:
    """Each round runs the commands on fresh copies of `template`; with `against`, the other checkout's
    commands (its source first on PYTHONPATH) run in the same round, just before this one's, so both
    meet the same load on a shared machine."""
    cli = command_line()
    trees = {"": {}, **({AGAINST: {"PYTHONPATH": str(against)}} if against else {})}
    times: dict[str, list[float]] = {}
    for index, extra in enumerate(trees.values()):
        warm = work / f"warm-up{index}"  # fills the bytecode cache; its own rewrite cache
        shutil.copytree(template, warm)
        env = {**installed_env(work), **extra, "PTO_PATCH_CACHE": str(work / f"warm-cache{index}")}
        for args in (
            ["--help"],
            ["apply", "--model-path", str(warm)],
            ["restore", "--model-path", str(warm)],
        ):
            timed("warm-up", [*cli, *args], env)
    for round_index in range(rounds):
        for label, extra in reversed(trees.items()):
            cache = work / f"cache{round_index}"  # empty: the first apply of this round rewrites
            env = {**installed_env(work), **extra, "PTO_PATCH_CACHE": str(cache)}
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
                times.setdefault(label + name, []).append(timed(label + name, [*cli, *args], env))
            for folder in (first, seen, cache):
                shutil.rmtree(folder, ignore_errors=True)
    return times


def engine_only(template: Path, work: Path, rounds: int) -> dict[str, list[float]]:
    from pto_patch.patching import engine

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
    parser.add_argument(
        "--against",
        type=Path,
        default=None,
        help="another pto-patch checkout (e.g. a `git worktree` of the commit before a change): its "
        "commands run in turn with this one's, each round, with the same interpreter and packages",
    )
    args = parser.parse_args()

    from pto_patch.model.locate import installed_transformers_release
    from pto_patch.tiny.model import make_tiny

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        template = work / "tiny"
        make_tiny(template)
        times = whole_process(template, work, args.rounds, args.against)
        times.update(engine_only(template, work, args.rounds))
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "transformers": installed_transformers_release(),
        "rounds": args.rounds,
        "command": " ".join(command_line()),
        "against": str(args.against) if args.against else None,
        "medians_s": medians,
        "cpu_medians_s": {
            name: statistics.median(values) for name, values in CPU_S.items() if name != "warm-up"
        },
        "targets_s": TARGETS,
        "runs_s": times,
    }
    print(
        f"transformers {result['transformers']}, {args.rounds} rounds, medians (whole process unless noted)"
    )
    order = [*TARGETS, "engine_apply_s", "engine_restore_s"]
    for name in (label + name for name in order for label in (AGAINST, "") if label + name in medians):
        median = medians[name]
        target = TARGETS.get(name.removeprefix(AGAINST))
        spread = f"{min(times[name]):.3f}-{max(times[name]):.3f}"
        goal = f"target <= {target:.1f} s" if target is not None else "in process"
        cpu = f"cpu {result['cpu_medians_s'][name]:.3f} s, " if name in CPU_S else ""
        print(f"  {name.removesuffix('_s'):<24} {median:7.3f} s   ({cpu}{spread}; {goal})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
