"""One system's ``compare_policies.py`` results before and after a change, side by side (two ``results.json``
files of the same seeds; run the "before" one at the earlier commit).

Per scenario and group: the hit rate, P99 TTFT (mean and the seeds' range), p50 and throughput, before -> after,
and a verdict per seed set: "same" when every seed's P99 is identical, "win" when the P99 is lower on every seed
of the set, "loss" when higher on every one, else "tie". ``--tuning`` names the seeds a change was tuned on
(default 0-3); the rest are held out and judged separately.

    .venv/bin/python benchmarks/compare_before_after.py BEFORE/results.json AFTER/results.json [--system geoprefix]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List


def _rows(path: str, system: str) -> Dict[tuple, dict]:
    with open(path) as f:
        data = json.load(f)
    return {(a["scenario"], a["group"]): a for a in data["aggregate"] if a["system"] == system}


def verdict(before: Dict[str, float], after: Dict[str, float], seeds: List[str]) -> str:
    pairs = [(before[s], after[s]) for s in seeds if s in before and s in after]
    if not pairs:
        return "-"
    if all(a == b for b, a in pairs):
        return "same"
    if all(a < b for b, a in pairs):
        return "win"
    if all(a > b for b, a in pairs):
        return "loss"
    return "tie"


def _range(m: dict) -> str:
    vals = list(m["seeds"].values())
    return f"{m['mean']:.2f} [{min(vals):.2f}-{max(vals):.2f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--system", default="geoprefix")
    ap.add_argument("--tuning", default="0,1,2,3", help="the seeds a change was tuned on; the others are held out")
    args = ap.parse_args(argv)
    before, after = _rows(args.before, args.system), _rows(args.after, args.system)
    missing = sorted(set(before) ^ set(after))
    if not before or missing:
        ap.error(f"the two files must hold the same {args.system} groups (only in one: {missing or 'all'})")
    tuning = [s for s in args.tuning.split(",") if s]
    print("| scenario / group | hit before -> after | P99 TTFT s before -> after (seed range) | p50 s | "
          "req/s before -> after | verdict (P99 on the tuning seeds; held out) |")
    print("|---|---|---|---|---|---|")
    for key in sorted(before):
        b, a = before[key], after[key]
        seeds = list(b["ttft_p99_s"]["seeds"])
        held = [s for s in seeds if s not in tuning]
        v = (f"{verdict(b['ttft_p99_s']['seeds'], a['ttft_p99_s']['seeds'], [s for s in seeds if s in tuning])}; "
             f"{verdict(b['ttft_p99_s']['seeds'], a['ttft_p99_s']['seeds'], held)}")
        print(f"| {key[0]} / {key[1]} | {b['prefix_hit_rate']['mean']:.3f} -> {a['prefix_hit_rate']['mean']:.3f} | "
              f"{_range(b['ttft_p99_s'])} -> {_range(a['ttft_p99_s'])} | {b['ttft_p50_s']['mean']:.3f} -> "
              f"{a['ttft_p50_s']['mean']:.3f} | {b['throughput_rps']['mean']:.2f} -> {a['throughput_rps']['mean']:.2f} "
              f"| {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
