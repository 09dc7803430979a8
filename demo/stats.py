"""Seed statistics for the demo's comparisons: mean ± standard error over fine-tuning seeds, and
the pretrained-vs-scratch summary the headline table shows.

The standard error is the sample standard deviation (``ddof=1``) over √n; two means are called
*apart* when their ±2 SE intervals do not overlap (the issue's criterion), a conservative stand-in
for a two-sample test at n = 3.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_se(values: Sequence[float]) -> dict:
    """``{"mean", "se", "n", "values"}`` of ``values``; ``se`` is 0 for a single value."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("mean_se of no values")
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return {"mean": mean, "se": math.sqrt(var / n), "n": n, "values": xs}


def compare(pretrained: Sequence[float], scratch: Sequence[float], *,
            higher_is_better: bool = True) -> dict:
    """Pretrained vs scratch over seeds: both `mean_se`, the difference of means (pretrained −
    scratch) with its standard error √(se₁² + se₂²), the ratio of means, and whether the ±2 SE
    intervals are apart with pretrained on the better side."""
    p, s = mean_se(pretrained), mean_se(scratch)
    diff = p["mean"] - s["mean"]
    better = diff > 0 if higher_is_better else diff < 0
    lo_p, hi_p = p["mean"] - 2 * p["se"], p["mean"] + 2 * p["se"]
    lo_s, hi_s = s["mean"] - 2 * s["se"], s["mean"] + 2 * s["se"]
    apart = (lo_p > hi_s) if higher_is_better else (hi_p < lo_s)
    return {"pretrained": p, "scratch": s, "difference": diff,
            "difference_se": math.sqrt(p["se"] ** 2 + s["se"] ** 2),
            "ratio": p["mean"] / s["mean"] if s["mean"] else float("nan"),
            "pretrained_better": better, "intervals_apart": apart}


def fmt(m: dict, scale: float = 1.0, digits: int = 1) -> str:
    """``"63.7 ± 0.4"`` of a `mean_se` (values multiplied by ``scale``, e.g. 100 for %)."""
    return f"{scale * m['mean']:.{digits}f} ± {scale * m['se']:.{digits}f}"
