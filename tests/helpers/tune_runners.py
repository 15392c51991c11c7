"""Stand-in timed runs for tune's selection."""


def lucky_then_even(lucky_runs: int):
    """A runner whose candidate is 10 % faster for its first `lucky_runs` runs, then no faster at all."""
    runs = {"candidate": 0}

    def run_once(candidate):
        if candidate.is_baseline:
            return 10.0
        runs["candidate"] += 1
        return 11.0 if runs["candidate"] <= lucky_runs else 10.0

    return run_once
