"""Draw docs/grafana-dashboard.png: the dashboard's panels evaluated on one real scrape of the operator.

Grafana needs a Prometheus with history; this draws what each panel shows at the moment of
one scrape, from the scrape alone: gauges as they are, ``rate``/``increase`` panels as the
counters' totals since the operator started, ``time() - X`` against the scrape's time, the
p95 from the histogram's buckets. It needs matplotlib, which the project does not depend on:

    pip install matplotlib
    COMPILECACHE_E2E_SCRAPE=/tmp/scrape.txt pytest tests/test_e2e.py \
        -k "pvc_example_reaches or gated_then or metrics_scraped"
    python bench/dashboard_png.py /tmp/scrape.txt docs/grafana-dashboard.png
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"


def load(scrape: Path) -> dict[str, list[tuple[dict[str, str], float]]]:
    series: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(scrape.read_text()):
        for sample in family.samples:
            series[sample.name].append((dict(sample.labels), sample.value))
    return series


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def group(rows: list[tuple[dict[str, str], float]], by: list[str]) -> list[tuple[dict[str, str], float]]:
    sums: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, value in rows:
        sums[tuple(labels.get(key, "") for key in by)] += value
    return [(dict(zip(by, key, strict=True)), value) for key, value in sums.items()]


def evaluate(expr: str, series: dict, now: float) -> list[tuple[dict[str, str], float]]:
    """What the panel's query gives at the scrape (the few query shapes the dashboard uses)."""
    names = re.findall(r"compilecache_\w+", expr)
    by = re.search(r"by \(([^)]*)\)", expr)
    keys = [key.strip() for key in by.group(1).split(",")] if by else None
    if expr.startswith("histogram_quantile"):
        quantile = float(re.search(r"histogram_quantile\(([\d.]+)", expr).group(1))
        buckets: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for labels, value in series[names[0]]:
            buckets[labels.get("result", "")].append((float(labels["le"]), value))
        out = []
        for result, rows in buckets.items():
            rows.sort()
            total = rows[-1][1]
            bound = next((le for le, count in rows if count >= quantile * total), math.inf)
            out.append(({"result": result}, bound if bound != math.inf else rows[-2][0]))
        return out
    rows = [(labels, value) for labels, value in series.get(names[0], [])]
    if expr.endswith("== 1"):
        return [(labels, value) for labels, value in rows if value == 1]
    if expr.startswith("time() -"):
        return [(labels, now - value) for labels, value in rows]
    if len(names) == 2 and "/" in expr:  # a ratio of two counters
        denominators = {tuple(sorted(labels.items())): value for labels, value in group(series.get(names[1], []), keys)}
        return [
            (labels, value / denominators[tuple(sorted(labels.items()))])
            for labels, value in group(rows, keys)
            if denominators.get(tuple(sorted(labels.items())))
        ]
    return group(rows, keys) if keys else rows


def main(scrape: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = load(scrape)
    now = scrape.stat().st_mtime
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * 5.2, rows * 2.9), facecolor="#111217")
    for ax, panel in zip(axes.flat, panels, strict=False):
        target = panel["targets"][0]
        values = evaluate(target["expr"], series, now)
        ax.set_facecolor("#181b1f")
        ax.set_title(panel["title"], color="#d8d9da", fontsize=11, loc="left")
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        ax.tick_params(colors="#8e8e8e", labelsize=8)
        if not values:
            ax.text(
                0.5,
                0.5,
                "no data (nothing happened yet)",
                color="#8e8e8e",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        names = [legend(target["legendFormat"], labels) for labels, _ in values]
        numbers = [value for _, value in values]
        unit = panel["fieldConfig"]["defaults"].get("unit", "short")
        if panel["type"] == "table":
            ax.axis("off")
            ax.text(0.02, 0.8, "\n".join(names), color="#73bf69", fontsize=12, va="top", transform=ax.transAxes)
            continue
        ax.barh(names, numbers, color="#5794f2")
        for y, value in enumerate(numbers):
            ax.text(value, y, " " + human(value, unit), color="#d8d9da", va="center", fontsize=9)
        ax.set_xlim(0, max(numbers) * 1.35 or 1)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(f"{dashboard['title']} — one scrape of the operator after the e2e loop", color="#d8d9da")
    fig.tight_layout()
    fig.savefig(out, dpi=90, facecolor=fig.get_facecolor())
    print(f"wrote {out}")


def human(value: float, unit: str) -> str:
    if unit == "bytes":
        for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(value) < 1024:
                return f"{value:.1f} {suffix}"
            value /= 1024
    if unit == "percentunit":
        return f"{100 * value:.0f}%"
    if unit == "s":
        return f"{value:.3g} s"
    if unit == "reqps":
        return f"{value:g} (total)"
    return f"{value:g}"


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
