"""``--plot FILE.png``: throughput against latency per level, and each level's latency spread."""

from __future__ import annotations

from tritium.perf.report import LevelReport


def plot_levels(path: str, model: str, reports: list[LevelReport]) -> None:
    import matplotlib

    matplotlib.use("Agg")   # files only; no display needed
    import matplotlib.pyplot as plt

    figure, (curve, spread) = plt.subplots(1, 2, figsize=(12, 4.5))
    p99 = [r.p99_us / 1000 for r in reports]
    throughput = [r.inferences_per_s for r in reports]
    curve.plot(p99, throughput, marker="o")
    for report, x, y in zip(reports, p99, throughput):
        curve.annotate(report.level_name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    curve.set_xlabel("p99 latency (ms)")
    curve.set_ylabel("throughput (infer/s)")
    curve.set_title(f"{model}: throughput against p99 latency")
    curve.grid(alpha=0.3)
    kind = "request rate" if any(r.request_rate for r in reports) else "concurrency"
    samples = [[v / 1000 for v in r.latencies_us] or [0.0] for r in reports]
    spread.boxplot(samples, whis=(1, 99), showfliers=False)
    spread.set_xticks(range(1, len(reports) + 1), [r.level_name for r in reports])
    spread.set_xlabel(kind)
    spread.set_ylabel("latency (ms)")
    spread.set_title("latency distribution (whiskers: p1 and p99)")
    spread.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
