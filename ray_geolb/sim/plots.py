"""PNG figures of run summaries: per group, a TTFT CDF per system, throughput bars, TTFT/e2e bars.

``plot_summaries(summaries, path, title)`` writes one figure with one row per group (a panel of the
paper's figure: a workload, or a replica count) and three columns:
(a) TTFT CDF per system (log x), (b) throughput (req/s, with output tok/s annotated),
(c) TTFT p50 / p90 / p99 bars (log y), and prefix hit rate annotated.
matplotlib is imported lazily with the Agg backend.
"""

from __future__ import annotations

from typing import Dict, List, Sequence

__all__ = ["plot_summaries"]


def _groups(summaries: Sequence[dict]) -> Dict[str, List[dict]]:
    out: Dict[str, List[dict]] = {}
    for m in summaries:
        out.setdefault(m.get("group") or m.get("workload", {}).get("name", ""), []).append(m)
    return out


def plot_summaries(summaries: Sequence[dict], path: str, title: str = "") -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _groups(summaries)
    nrows = max(1, len(groups))
    fig, axes = plt.subplots(nrows, 3, figsize=(17, 3.6 * nrows), squeeze=False)
    cmap = plt.get_cmap("tab10")
    systems = []
    for m in summaries:
        if m["system"] not in systems:
            systems.append(m["system"])
    color = {s: cmap(i % 10) for i, s in enumerate(systems)}
    for row, (g, ms) in enumerate(groups.items()):
        ax_cdf, ax_tp, ax_lat = axes[row]
        for m in ms:
            cdf = m.get("ttft_cdf") or []
            if cdf:
                ys = [i / 100 for i in range(len(cdf))]
                ax_cdf.plot([max(x, 1e-3) for x in cdf], ys, label=m["system"], color=color[m["system"]],
                            lw=2.2 if m["system"].startswith("skylb") else 1.3)
        ax_cdf.set_xscale("log")
        ax_cdf.set_xlabel("TTFT (s, log)")
        ax_cdf.set_ylabel("CDF")
        ax_cdf.set_title(f"{g}: TTFT CDF")
        ax_cdf.grid(alpha=0.3, which="both")
        ax_cdf.legend(fontsize=7, loc="lower right")

        names = [m["system"] for m in ms]
        xs = range(len(ms))
        tp = [m["throughput_rps"] for m in ms]
        bars = ax_tp.bar(xs, tp, color=[color[s] for s in names])
        for b, m in zip(bars, ms):
            ax_tp.annotate(f"{m['throughput_rps']:.1f}\n{m['prefix_hit_rate']:.0%} hit", (b.get_x() + b.get_width() / 2,
                           b.get_height()), ha="center", va="bottom", fontsize=7)
        ax_tp.set_xticks(list(xs))
        ax_tp.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax_tp.set_ylabel("throughput (req/s)")
        ax_tp.set_title(f"{g}: throughput (label: req/s, prefix hit)")
        ax_tp.set_ylim(0, max(tp + [1e-9]) * 1.25)

        w = 0.27
        for k, (q, alpha) in enumerate((("p50", 1.0), ("p90", 0.65), ("p99", 0.35))):
            vals = [max((m["ttft_s"].get(q) or 0.0), 1e-3) for m in ms]
            ax_lat.bar([x + (k - 1) * w for x in xs], vals, w, color=[color[s] for s in names], alpha=alpha,
                       label=f"TTFT {q}", edgecolor="k", linewidth=0.3)
        ax_lat.set_yscale("log")
        ax_lat.set_xticks(list(xs))
        ax_lat.set_xticklabels(names, rotation=35, ha="right", fontsize=8)
        ax_lat.set_ylabel("TTFT (s, log)")
        ax_lat.set_title(f"{g}: TTFT p50 / p90 / p99")
        ax_lat.legend(fontsize=7)
        ax_lat.grid(alpha=0.3, axis="y", which="both")
    if title:
        fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
