"""Wall time of `apply` and `restore` on the installed transformers' real modeling file.

Each round patches a fresh hub-style folder (config.json only; the modeling source comes from the
installed transformers, as for GutenOCR-3B) and restores it. Reports medians; the target is
apply under 1 s on a 2-core CPU.

    python benchmarks/bench_apply.py [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from pto_patch import engine
from pto_patch.locate import installed_transformers_release

CONFIG = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    apply_s, restore_s = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            folder = Path(tmp) / f"model{round_index}"
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(CONFIG, indent=2))
            started = time.perf_counter()
            engine.apply_patch(model_path=folder)
            apply_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            engine.restore_model(model_path=folder)
            restore_s.append(time.perf_counter() - started)
    result = {
        "transformers": installed_transformers_release(),
        "rounds": args.rounds,
        "apply_median_s": statistics.median(apply_s),
        "apply_first_s": apply_s[0],
        "restore_median_s": statistics.median(restore_s),
        "apply_target_s": 1.0,
    }
    print(f"transformers {result['transformers']}, {args.rounds} rounds")
    print(
        f"apply   median {result['apply_median_s']:.3f} s (first {result['apply_first_s']:.3f} s; target < 1 s)"
    )
    print(f"restore median {result['restore_median_s']:.3f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
