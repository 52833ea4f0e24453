"""Run many seeds outside pytest and count what they find, by profile and invariant:
``.venv/bin/python -m tests.sim.survey 0 300`` (seeds 0..299; ``-v``: one line a seed).
A tool for choosing the profiles' probabilities, not a test."""

from __future__ import annotations

import argparse
import time
from collections import Counter

from tests.sim.run import configure, run_seed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("first", type=int)
    parser.add_argument("end", type=int)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--profile", help="only the seeds of this profile")
    args = parser.parse_args()
    began = time.perf_counter()
    found: Counter[tuple[str, str]] = Counter()
    seeds: dict[tuple[str, str], list[int]] = {}
    for seed in range(args.first, args.end):
        if args.profile and configure(seed).profile != args.profile:
            continue
        result = run_seed(seed)
        rule = result.violations[0].rule if result.violations else "ok"
        key = (result.config.profile, rule)
        found[key] += 1
        seeds.setdefault(key, []).append(seed)
        if args.verbose:
            print(seed, result.config.profile, rule,
                  result.violations[0].text if result.violations else "", flush=True)
    print(f"{sum(found.values())} seeds in {time.perf_counter() - began:.1f}s")
    for (profile, rule), count in sorted(found.items()):
        shown = " ".join(map(str, seeds[(profile, rule)][:12]))
        print(f"{profile:10} {rule:16} {count:4}  {shown}")


if __name__ == "__main__":
    main()
