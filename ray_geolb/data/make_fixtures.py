"""Rebuild the small shipped fixtures from the full public data.

Usage:  python -m ray_geolb.data.make_fixtures /path/to/shared/data   (or run this file directly)

Deterministic: same inputs -> byte-identical outputs (gzip written with mtime=0, no file name).
See SOURCES.md in this folder for what each fixture is and where the inputs come from.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import shutil
import sys
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parent
MAX_MSG_CHARS = 4000
MAX_CONV_CHARS = 30000  # after truncation; keeps the fixtures small


def _write_gz(path: Path, text: str) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as g:
        g.write(text.encode("utf-8"))
    path.write_bytes(buf.getvalue())


def _jsonl(path: Path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def sharegpt(src: Path, n: int = 60) -> None:
    rows = _jsonl(src / "sharegpt_sample" / "sharegpt_sample_1000.jsonl")
    keep = []
    for r in rows:
        conv = r.get("conversations") or []
        if not conv or conv[0]["from"] != "human" or not any(m["from"] == "gpt" for m in conv):
            continue
        msgs = [{"from": m["from"], "value": m["value"][:MAX_MSG_CHARS]} for m in conv]
        if sum(len(m["value"]) for m in msgs) <= MAX_CONV_CHARS:
            keep.append({"id": r["id"], "conversations": msgs})
    keep.sort(key=lambda r: r["id"])
    pick = sorted(random.Random(0).sample(keep, n), key=lambda r: r["id"])
    _write_gz(OUT / "sharegpt_60.jsonl.gz", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pick))


def wildchat(src: Path, per_region: int = 20) -> None:
    from ray_geolb.sim.workloads.conversation import COUNTRY_REGION

    rows = _jsonl(src / "wildchat_sample" / "wildchat_with_region.jsonl")
    by_region = defaultdict(list)
    for r in rows:
        md = r.get("metadata") or {}
        region = COUNTRY_REGION.get(md.get("country") or "")
        if region is None:
            continue
        msgs = [{"role": m["role"], "content": m["content"][:MAX_MSG_CHARS]} for m in r["messages"]]
        if sum(len(m["content"]) for m in msgs) > MAX_CONV_CHARS:
            continue
        meta = {k: md.get(k) for k in ("model", "timestamp", "turn_count", "language", "country", "state")}
        by_region[region].append({"id": r["id"], "conversation_hash": r["conversation_hash"],
                                  "messages": msgs, "metadata": meta})
    pick = []
    for region in ("us", "eu", "asia"):
        pool = sorted(by_region[region], key=lambda r: r["id"])
        pick += random.Random(f"0:{region}").sample(pool, min(per_region, len(pool)))
    pick.sort(key=lambda r: r["id"])
    _write_gz(OUT / "wildchat_60.jsonl.gz", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in pick))


def head_lines(src_file: Path, dst: Path, n: int) -> None:
    with open(src_file, encoding="utf-8", newline="") as f:
        lines = [line for _, line in zip(range(n), f)]
    dst.write_text("".join(lines), encoding="utf-8", newline="")


def servegen(src: Path, n_clients: int = 24, day_s: int = 86400) -> None:
    path = src / "servegen" / "servegen_language_m-large_client_rates.csv"
    volume: dict[int, float] = defaultdict(float)
    rows: list[list[str]] = []
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        for row in reader:
            if int(row[1]) < day_s:
                rows.append(row)
                volume[int(row[0])] += float(row[2]) * 600
    top = set(sorted(volume, key=lambda c: (-volume[c], c))[:n_clients])
    keep = sorted((r for r in rows if int(r[0]) in top), key=lambda r: (int(r[0]), int(r[1])))
    _write_gz(OUT / "servegen_m-large_24clients_1day.csv.gz",
              ",".join(header) + "\n" + "".join(",".join(r) + "\n" for r in keep))


def gpu_step_times(src: Path) -> None:
    """The GPU step times (``gpu_step_times/``): each run's rows ``[P, c, B, L, median_s]`` (a long-context
    run's ``reference`` rows, repeats of the first grid, after its own) and the multi-chunk design checks,
    per card (the step-time fit's input; ``python -m ray_geolb.engine.step_fit``)."""
    d = src / "gpu_step_times"

    def run(name: str) -> dict:
        r = json.loads((d / name).read_text())
        info = r["info"]
        out = {"file": name, "gpu": info["gpu"], "sms": info.get("sms"), "mem_total_bytes": info.get("mem_total"),
               "torch": info["torch"],
               "rows": [[x["P"], x["c"], x["B"], x["L"], round(x["median_s"], 9)]
                        for x in r["rows"] + r.get("reference", [])]}
        if r.get("reference"):
            out["reference_rows"] = len(r["reference"])
        if "validation" in r:
            out["design_checks"] = [{"chunks": x["chunks"], "B": x["B"], "L": x["L"],
                                     "median_s": round(x["median_s"], 9)} for x in r["validation"]]
        return out

    fx = {
        "what": "GPU time (median of 10 CUDA-graph replays) of ONE continuous-batching step of a Llama-3.1-8B-shaped "
                "transformer (bf16, random weights, torch SDPA). A row [P, c, B, L, median_s] = one prefill chunk of "
                "P new tokens over c cached ones plus B decodes of context L each; a run's last 'reference_rows' "
                "rows repeat rows of the first grid on that run's machine. 'design_checks' = steps with several "
                "prefill chunks [[P_i, c_i], ...]: never fitted on, but seen while the model's form was chosen, "
                "so they check the design, not a held-out fit.",
        "source": "Measured for this project with measure_step_times.py (../shared/data/gpu_step_times/, README "
                  "there), driver 580.159.04, PyTorch 2.11.0+cu130: on 2026-11-26 one H100 80GB HBM3 SXM (two "
                  "machines: run1, run2 with the multi-chunk steps) and one H200; on 2026-11-28 the long-context "
                  "rows (short chunks over long cached contexts, lone decodes over very long contexts) on "
                  "another H100 SXM and another H200. Derived here: the rows' configuration and median_s only.",
        "license": "measurements made for this project; use freely",
        "model": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "vocab": 128256},
        "cards": {
            "h100-sxm": [run("llama3.1-8b_h100-sxm_steps.json"),
                         run("llama3.1-8b_h100-sxm_steps_run2_with_validation.json"),
                         run("llama3.1-8b_h100-sxm_long-context_steps.json")],
            "h200": [run("llama3.1-8b_h200_steps.json"),
                     run("llama3.1-8b_h200_long-context_steps.json")],
        },
    }
    (OUT / "gpu_step_times").mkdir(exist_ok=True)
    (OUT / "gpu_step_times" / "llama3.1-8b_steps.json").write_text(json.dumps(fx, indent=1) + "\n")


#: ServeGen m-large tenants kept for the ``geo-workday-3`` day shape: a stable daily routine (each day's hourly
#: shares correlate with the client's 14-day mean day at >= WORKDAY_MIN_CONSISTENCY on average) that is a working
#: day (>= WORKDAY_MIN_SHARE of its requests in local hours WORKDAY_HOURS).
WORKDAY_MIN_CONSISTENCY = 0.8
WORKDAY_MIN_SHARE = 0.75
WORKDAY_HOURS = (8, 20)


def servegen_workday(src: Path, out: Path = OUT) -> Path:
    """``servegen_m-large_workday_tenants_hourly.csv``: the summed 14-day mean hourly rate (req/s, t = 0 = local
    midnight) of the ServeGen m-large tenants with a working-day routine (the rule above); the clients kept and
    their share of all requests in the header comments."""
    import numpy as np

    path = src / "servegen" / "servegen_language_m-large_client_rates.csv"
    rates: dict[int, "np.ndarray"] = {}
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        next(reader)
        for row in reader:
            c, w = int(row[0]), int(row[1]) // 600
            rates.setdefault(c, np.zeros(14 * 144))[w] += float(row[2])
    total = sum(float(x.sum()) for x in rates.values())
    keep = []
    for c in sorted(rates):
        days = rates[c].reshape(14, 24, 6).mean(axis=2)
        mean_day = days.mean(axis=0)
        if mean_day.sum() <= 0:
            continue
        share = mean_day / mean_day.sum()
        corr = [float(np.corrcoef(d / d.sum(), share)[0, 1]) for d in days if d.sum() > 0 and d.std() > 0]
        h0, h1 = WORKDAY_HOURS
        if corr and np.mean(corr) >= WORKDAY_MIN_CONSISTENCY and share[h0:h1].sum() >= WORKDAY_MIN_SHARE:
            keep.append(c)
    hourly = sum(rates[c] for c in keep).reshape(14, 24, 6).mean(axis=(0, 2))
    vol = sum(float(rates[c].sum()) for c in keep) / total
    lines = [
        "# ServeGen (alibaba/ServeGen via azaj01/ServeGen, data commit 4d6f0c7795d6b7ddc61fae1eeb73f9bd5a118f8f),",
        "# language m-large, 162 tenants x 14 days of 10-min windows; Apache-2.0; cite Xiang et al., arXiv:2505.09999.",
        f"# Tenants with a working-day routine: mean daily correlation with their own mean day >= "
        f"{WORKDAY_MIN_CONSISTENCY:g} and >= {WORKDAY_MIN_SHARE:.0%} of requests in local {WORKDAY_HOURS[0]:02d}:00-"
        f"{WORKDAY_HOURS[1]:02d}:00.",
        f"# clients: {' '.join(map(str, keep))} ({vol:.1%} of all m-large requests)",
        "# rate_rps: their summed request rate, mean over the 14 days of each local hour (t = 0 = local midnight).",
        "# Made by ray_geolb/data/make_fixtures.py (servegen_workday); see SOURCES.md.",
        "local_hour,rate_rps",
    ] + [f"{h},{x:.6f}" for h, x in enumerate(hourly)]
    dst = out / "servegen_m-large_workday_tenants_hourly.csv"
    dst.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dst


def _azure_ts_100ns(s: str) -> int:
    """``YYYY-MM-DD HH:MM:SS.fffffff`` (no time zone) -> integer 100-ns units (calendar.timegm: no local time)."""
    import calendar
    import time

    whole, _, frac = s.strip().partition(".")
    sec = calendar.timegm(time.strptime(whole, "%Y-%m-%d %H:%M:%S"))
    return sec * 10_000_000 + int((frac + "0000000")[:7])


def azure_arrivals(src: Path, out: Path = OUT) -> Path:
    """``azure_2023_arrivals.csv.gz``: both Azure 2023 traces (code and conv) merged in time order, one row per
    request: the gap to the previous request (microseconds, rounded; 0 for the first), the service and the
    trace's token counts."""
    rows = []
    for service in ("code", "conv"):
        with open(src / "azure_llm_2023" / f"AzureLLMInferenceTrace_{service}.csv", encoding="utf-8",
                  newline="") as f:
            reader = csv.reader(f)
            next(reader)
            rows += [(_azure_ts_100ns(r[0]), service, int(r[1]), int(r[2])) for r in reader if r]
    rows.sort()
    lines, prev = ["gap_us,service,context_tokens,generated_tokens"], rows[0][0]
    for t, service, ctx, gen in rows:
        lines.append(f"{(t - prev + 5) // 10},{service},{ctx},{gen}")
        prev = t
    dst = out / "azure_2023_arrivals.csv.gz"
    _write_gz(dst, "\n".join(lines) + "\n")
    return dst


def demand_fixtures(src: Path, out: Path = OUT) -> list:
    """The fixtures behind the ``geo-workday-3`` and ``azure-bursty-3`` demands (``sim/workloads/geo_diurnal.py``);
    FileNotFoundError naming the raw data's folder where ``src`` lacks it."""
    for sub in ("servegen", "azure_llm_2023"):
        if not (src / sub).is_dir():
            raise FileNotFoundError(f"{src / sub}: no such folder; the demand fixtures are made from the shared data "
                                    f"folder's servegen/ and azure_llm_2023/ (SOURCES.md)")
    return [servegen_workday(src, out), azure_arrivals(src, out)]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: make_fixtures.py SHARED_DATA_DIR")
    src = Path(argv[0])
    sharegpt(src)
    wildchat(src)
    head_lines(src / "gsm8k" / "test.jsonl", OUT / "gsm8k_test_300.jsonl", 300)
    head_lines(src / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv", OUT / "azure_code_2000.csv", 2001)
    head_lines(src / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv", OUT / "azure_conv_2000.csv", 2001)
    servegen(src)
    gpu_step_times(src)
    demand_fixtures(src)
    shutil.copyfile(src / "region_latency" / "ibm_cloud_inter_region_rtt_ms_2024-03-03.csv",
                    OUT / "ibm_cloud_inter_region_rtt_ms_2024-03-03.csv")
    for p in sorted(OUT.iterdir()):
        if p.is_file() and p.suffix != ".py" and p.name != "SOURCES.md":
            print(f"{p.name}\t{p.stat().st_size}")


if __name__ == "__main__":
    sys.path.insert(0, str(OUT.parents[1]))
    main()
