"""A step grid's two answers (``geosearch.search.stats.steps``): how a main effect at the
shared step and at each assignment's own best step is worded side by side. The ranking of a
whole grid study is tested with the fake trainer in ``tests/search/study/test_step_grid.py``
and ``test_step_halving.py``."""

from __future__ import annotations

from geosearch.search.stats.ranking import Ranking
from geosearch.search.stats.scores import MainEffect
from geosearch.search.stats.ranking import StepAnswers


def test_an_effect_without_spread_at_the_shared_step_is_not_called_absent_there():
    own = MainEffect("attn", "dgram", "stiefel", 0.04, 0.01, 4, (2, 2))
    unknown = MainEffect("attn", "dgram", "stiefel", 0.02, None, 0, (1, 1))
    within = MainEffect("attn", "dgram", "stiefel", 0.005, 0.01, 4, (2, 2))
    lines = {}
    for name, shared in (("unknown", unknown), ("within", within)):
        answers = StepAnswers(0.02, Ranking([], [], ""), {}, (0.5, 1.0, 2.0), effects=(("attn", shared, own),))
        lines[name] = answers.effect_lines()[0]
    # Rule: with no spread at the shared step the effect is not judged there (one seed a
    # point), not said to appear only at the own steps, which claims the shared one is noise.
    assert "at the shared step not judged (no spread)" in lines["unknown"]
    assert "spread unknown" in lines["unknown"] and "appears only" not in lines["unknown"]
    assert lines["within"].startswith("attention's geometry appears only with each assignment at its own best step")
