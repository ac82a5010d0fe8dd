"""The validation figure (matplotlib, Agg; the ``bench`` extra).

Rows 1..P: per preset, one panel per lambda0 with the simulated hit ratio (dots) and the two
estimators' forecasts (lines) over N (log scale). Last row: mean |error| over lambda0 vs N per
preset for both estimators and the mean-field intent estimator, and the theorem series.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvcast.lab.reports.validation_report import ValidationReport


def plot_report(report: ValidationReport, path: str | Path) -> None:
    """Write the figure to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = report.grid
    presets, lambdas = grid.presets, grid.lambdas
    cols = max(len(lambdas), len(presets) + 1)
    fig, axes = plt.subplots(
        len(presets) + 1, cols, figsize=(4.2 * cols, 3.3 * (len(presets) + 1)), squeeze=False
    )
    styles = {
        report.single_class: ("single-class (paper)", "tab:red", "--"),
        report.mean_field_intent: ("intent, mean field", "tab:orange", ":"),
        report.product: ("intent-aware (product)", "tab:blue", "-"),
    }
    for r, name in enumerate(presets):
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(lambdas):
                ax.axis("off")
                continue
            pts = sorted(
                (p for p in report.points if p.preset == name and p.lambda0 == lambdas[c]),
                key=lambda p: p.capacity_blocks,
            )
            n = [p.capacity_blocks for p in pts]
            ax.plot(n, [p.simulated for p in pts], "ko", ms=5, label="simulated (Algorithm 1)")
            for est, (label, color, ls) in styles.items():
                ax.plot(n, [p.forecasts[est] for p in pts], ls, color=color, label=label)
            ax.set_xscale("log")
            ax.set_ylim(0, 0.85)
            ax.set_title(f"{name}, lambda0 = {lambdas[c]:g}/s", fontsize=10)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("hit ratio")
            if r == 0 and c == 0:
                ax.legend(fontsize=8, loc="upper left")
    last = axes[len(presets)]
    for c, name in enumerate(presets):
        ax = last[c]
        caps = sorted({p.capacity_blocks for p in report.points if p.preset == name})
        for est, (label, color, ls) in styles.items():
            mae = [
                np.mean(
                    [
                        abs(p.error(est))
                        for p in report.points
                        if p.preset == name and p.capacity_blocks == n
                    ]
                )
                for n in caps
            ]
            ax.plot(caps, mae, ls, color=color, marker="o", ms=3, label=label)
        ax.axhline(0.01, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 0.3)
        ax.set_title(f"{name}: mean |error| over lambda0", fontsize=10)
        ax.set_xlabel("N (blocks)")
        ax.grid(alpha=0.3, which="both")
        if c == 0:
            ax.set_ylabel("|forecast - simulated|")
            ax.legend(fontsize=8, loc="lower left")
    ax = last[len(presets)]
    if report.theorem:
        x = np.arange(len(report.theorem))
        for est, (label, color, ls) in styles.items():
            ax.plot(
                x,
                [max(abs(p.error(est)), 1e-5) for p in report.theorem],
                ls,
                color=color,
                marker="o",
                ms=4,
                label=label,
            )
        ax.set_xticks(x, [f"{p.lambda0:g}/{p.capacity_blocks}" for p in report.theorem], fontsize=7)
        ax.set_yscale("log")
        ax.set_xlabel("lambda0 / N (scaled together)")
        ax.set_title(f"theorem series ({grid.theorem_preset}): |error|", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    for c in range(len(presets) + 1, cols):
        last[c].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
