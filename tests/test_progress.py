"""Console step progress: N/total and the time left at the recent pace."""

from __future__ import annotations

from agentgym.observe.progress import StepClock, fmt_seconds


def test_fmt_seconds() -> None:
    assert [fmt_seconds(x) for x in (0, 42, 185, 3720)] == ["0s", "42s", "3m05s", "1h02m"]


def test_step_clock_estimates_from_the_steps_it_saw() -> None:
    c = StepClock(total=10, window=3)
    assert c.fields(4, now=100.0) == {"progress": "4/10"}  # a resumed run: no pace yet
    assert c.fields(5, now=102.0) == {"progress": "5/10", "left": "10s"}
    c.fields(6, now=104.0)
    c.fields(7, now=106.0)
    # the window holds steps 5..8: (116 - 102) / 3 s per step, 2 steps left = 9.3 s
    assert c.fields(8, now=116.0) == {"progress": "8/10", "left": "9s"}
