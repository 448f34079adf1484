"""Plot a run's training curves (reward, accuracy, length, entropy, KL, step time, validation) into one PNG.

python tools/plot_metrics.py checkpoints/quiver/my_run                 # writes checkpoints/quiver/my_run/curves.png
python tools/plot_metrics.py run/metrics.jsonl --out curves.png --keys critic/score/mean actor/grad_norm
"""

from __future__ import annotations

import argparse
import sys

from verl.utils.plotting import plot_metrics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="a run directory holding metrics.jsonl, or the metrics.jsonl itself")
    parser.add_argument("--out", default=None, help="PNG to write (default: curves.png beside the jsonl)")
    parser.add_argument("--keys", nargs="+", default=None, help="metrics to plot instead of the default panels")
    args = parser.parse_args(argv)
    try:
        out = plot_metrics(args.path, args.out, keys=args.keys)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(str(e))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
