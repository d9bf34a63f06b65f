"""Regression verdict of one saturation result against a committed baseline result.

Method (CometBFT's QA process): a change beyond 10% of the baseline is a regression. Only
figures that measure cost or failure decide the verdict:

- CPU per message, a figure whose name holds "cpu_ms_per_message" (per role, milliseconds);
- loss, a figure whose name ends in "loss_ratio" (lost / offered, 0..1).

Per such figure: "regressed" when the new value exceeds baseline x (1 + threshold) (for a
baseline of 0: any new value above `loss_floor`), "improved" below baseline x (1 - threshold),
else "equal"; "missing" when the new result lacks a figure the baseline has (a failure: the
comparison cannot vouch for it). Other numeric figures (rates, p50/p99) are printed as "info"
with their change and never fail the run: on a machine shared with other jobs, wall-clock
figures swing far more than 10% while CPU per message does not.

    python -m qa.compare NEW.json BASELINE.json [--threshold 0.10]

Exit status: 0 no regression, 1 a regression or a missing figure, 2 unreadable input.
Inputs are bench/result_file.py results: {"figures": {name: number | str | None}, ...}.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Verdict", "compare", "decides", "format_verdicts", "regressed", "THRESHOLD", "main"]

#: relative change beyond which a deciding figure is a regression (CometBFT QA: 10%)
THRESHOLD = 0.10
#: a loss ratio at or below this counts as zero (one lost message in a million offered)
LOSS_FLOOR = 1e-6


@dataclass(frozen=True)
class Verdict:
    """One figure's comparison. verdict: regressed | improved | equal | missing | new | info."""
    figure: str
    baseline: float | None
    new: float | None
    verdict: str

    @property
    def change(self) -> float | None:
        """(new - baseline) / baseline, None when either is absent or the baseline is 0."""
        if self.baseline in (None, 0) or self.new is None:
            return None
        return (self.new - self.baseline) / self.baseline


def decides(name: str) -> bool:
    """True for the figures a regression verdict rests on (CPU per message, loss)."""
    return "cpu_ms_per_message" in name or name.endswith("loss_ratio")


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def compare(new: dict, baseline: dict, threshold: float = THRESHOLD,
            loss_floor: float = LOSS_FLOOR) -> list[Verdict]:
    """Verdicts for every numeric figure of `baseline` and `new` (result dicts with a
    "figures" mapping), baseline order first. ValueError when either has no figures."""
    try:
        fb, fn = baseline["figures"], new["figures"]
    except (KeyError, TypeError):
        raise ValueError("a result needs a 'figures' mapping") from None
    if not isinstance(fb, dict) or not isinstance(fn, dict):
        raise ValueError("'figures' must be a mapping")
    out = []
    for name, bv in fb.items():
        b = _num(bv)
        if b is None:
            continue
        n = _num(fn.get(name))
        if not decides(name):
            out.append(Verdict(name, b, n, "info"))
            continue
        if n is None:
            out.append(Verdict(name, b, None, "missing"))
            continue
        if b == 0:
            floor = loss_floor if name.endswith("loss_ratio") else 0.0
            verdict = "regressed" if n > floor else "equal"
        elif n > b * (1 + threshold):
            verdict = "regressed"
        elif n < b * (1 - threshold):
            verdict = "improved"
        else:
            verdict = "equal"
        out.append(Verdict(name, b, n, verdict))
    for name, nv in fn.items():
        if name not in fb and _num(nv) is not None:
            out.append(Verdict(name, None, _num(nv), "new"))
    return out


def regressed(verdicts: list[Verdict]) -> bool:
    """True when any verdict is "regressed" or "missing"."""
    return any(v.verdict in ("regressed", "missing") for v in verdicts)


def format_verdicts(verdicts: list[Verdict], threshold: float = THRESHOLD) -> str:
    """One line per figure: name, baseline, new, change %, verdict; then the overall line."""
    def fmt(x):
        return "-" if x is None else f"{x:.6g}"
    lines = [f"{'figure':58s} {'baseline':>12s} {'new':>12s} {'change':>8s}  verdict"]
    for v in verdicts:
        ch = "-" if v.change is None else f"{v.change * 100:+.1f}%"
        lines.append(f"{v.figure:58s} {fmt(v.baseline):>12s} {fmt(v.new):>12s} {ch:>8s}  {v.verdict}")
    bad = [v for v in verdicts if v.verdict in ("regressed", "missing")]
    lines.append(f"verdict: {'REGRESSION' if bad else 'ok'} ({len(bad)} of "
                 f"{sum(decides(v.figure) for v in verdicts)} CPU-per-message and loss figures beyond "
                 f"{threshold * 100:g}% or missing)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("new", type=Path, help="a result JSON (bench/result_file.py)")
    ap.add_argument("baseline", type=Path, help="the baseline result JSON")
    ap.add_argument("--threshold", type=float, default=THRESHOLD, help="relative change (default 0.10)")
    args = ap.parse_args(argv)
    try:
        new = json.loads(args.new.read_text())
        base = json.loads(args.baseline.read_text())
        verdicts = compare(new, base, args.threshold)
    except (OSError, ValueError) as exc:
        print(f"qa.compare: {exc}", file=sys.stderr)
        return 2
    print(format_verdicts(verdicts, args.threshold))
    return 1 if regressed(verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
