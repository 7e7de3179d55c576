"""The health audit's judgement written from docs/definitions.md, "Health audit": the grade and fail
reasons of one window at the default thresholds, and the breaker table."""

from __future__ import annotations

from fractions import Fraction


def judged(
    kw_per_tops: Fraction | None, sched_deviation: Fraction, coverage: Fraction, faults_fatal: int = 0
) -> tuple[str, list[str]]:
    """A window's grade and its failed checks, in the definition's order (grade, sched_deviation, coverage,
    device_fault: a fatal device fault new in one of its samples)."""
    if kw_per_tops is None:
        grade = "idle"
    elif kw_per_tops < Fraction("0.18") and sched_deviation < Fraction("0.021"):
        grade = "excellent"
    elif kw_per_tops <= Fraction("0.25") and sched_deviation <= Fraction("0.045"):
        grade = "good"
    else:
        grade = "needs_optimisation"
    checks = (
        ("grade", grade == "needs_optimisation"),
        ("sched_deviation", sched_deviation > Fraction("0.05")),
        ("coverage", coverage < Fraction("0.95")),
        ("device_fault", faults_fatal > 0),
    )
    return grade, [reason for reason, failed in checks if failed]


#: (state, passed, covered) → next state, and what happens to the count; written from the breaker table of
#: docs/definitions.md, "Health audit"
def reference_breaker(windows: list[tuple[int, bool, bool]], admission: int, readmit: int) -> list[tuple[str, int]]:
    """For each window k (ascending; with its verdict and whether coverage was met) the state after it and
    the windows skipped before it."""
    state, count, last, out = ("probation" if admission else "in_service"), 0, None, []
    for k, passed, covered in windows:
        skipped = 0 if last is None else k - last - 1
        for verdict in [(False, False)] * skipped + [(passed, covered)]:
            ok, cov = verdict
            if state == "probation":
                count = count + 1 if cov else 0
                if count >= admission:
                    state, count = "in_service", 0
            elif state == "in_service" and not ok:
                state = "observation"
            elif state == "observation":
                state, count = ("in_service", 0) if ok else ("removed", 0)
            elif state == "removed":
                count = count + 1 if ok else 0
                if count >= readmit:
                    state, count = "in_service", 0
        out.append((state, skipped))
        last = k
    return out
