"""Training curves from a run's metrics.jsonl (written by `verl.utils.tracking`) as one PNG:
`plot_metrics("checkpoints/quiver/my_run")` writes `checkpoints/quiver/my_run/curves.png`.
`tools/plot_metrics.py` is the command-line front end.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from verl.utils.tracking import METRICS_FILE, read_metrics

# (panel title, metric keys): the first key present in the file is drawn. KL comes from the loss when
# `actor.use_kl_loss`, from the reward penalty when `algorithm.use_kl_in_reward`, else the policy ratio's own KL.
DEFAULT_PANELS = [
    ("reward", ["critic/score/mean"]),
    ("accuracy", ["critic/accuracy"]),
    ("response length", ["response_length/mean"]),
    ("entropy", ["actor/entropy"]),
    ("KL", ["actor/kl_loss", "actor/reward_kl_penalty", "actor/ppo_kl"]),
    ("step time (s)", ["timing_s/step"]),
]
VALIDATION_PREFIX = "val-core/"
# A series with fewer points than this also gets markers, so a run of a few steps (or one point) is still visible.
MARKER_BELOW = 30


def _series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in records if _is_number(r.get(key))]
    return [s for s, _ in points], [v for _, v in points]


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _resolve(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path / METRICS_FILE if path.is_dir() else path


def plot_metrics(
    jsonl_path: str | os.PathLike, out_path: str | os.PathLike | None = None, keys: list[str] | None = None
) -> str:
    """Draw one subplot per metric against the step and save the grid as a PNG.

    jsonl_path: a metrics.jsonl, or the run directory holding it.
    out_path: the PNG to write (default: curves.png beside the jsonl).
    keys: the metrics to draw (default: `DEFAULT_PANELS` plus every `val-core/*` series, drawn as points).
    Keys missing from the file are skipped with a note on stdout. Returns the PNG's path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = _resolve(jsonl_path)
    if not path.is_file():
        raise FileNotFoundError(f"plot_metrics: no metrics file at {path}")
    records = read_metrics(path)
    if not records:
        raise ValueError(f"plot_metrics: {path} holds no metrics lines")
    present = {key for r in records for key, value in r.items() if _is_number(value)} - {"step", "time"}

    panels = DEFAULT_PANELS + [(key, [key]) for key in sorted(present) if key.startswith(VALIDATION_PREFIX)]
    if keys is not None:
        panels = [(key, [key]) for key in keys]
    chosen = []
    for title, candidates in panels:
        key = next((k for k in candidates if k in present), None)
        if key is None:
            print(f"plot_metrics: skipping {title}: {' / '.join(candidates)} not in {path}")
        else:
            chosen.append((title, key))
    if not chosen:
        raise ValueError(f"plot_metrics: none of the requested metrics are in {path}; it has: {sorted(present)}")

    ncols = min(3, len(chosen))
    nrows = math.ceil(len(chosen) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax, (title, key) in zip(axes.flat, chosen):
        steps, values = _series(records, key)
        if key.startswith(VALIDATION_PREFIX):
            ax.plot(steps, values, "o", color="tab:orange")
        else:
            ax.plot(steps, values, marker="o" if len(steps) < MARKER_BELOW else None, markersize=3)
        ax.set_title(title if title == key else f"{title}\n{key}", fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(chosen) :]:
        ax.set_visible(False)
    fig.suptitle(str(path), fontsize=9)
    fig.tight_layout()

    out = Path(out_path) if out_path is not None else path.parent / "curves.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return str(out)
