"""The horizon: the target run and its rungs (:mod:`.target`), the stability rung
(:mod:`.stability`), Σ η and the ladder (:mod:`.ladder`), the max-logit forecast
(:mod:`.forecast`), the logit-growth pruner (:mod:`.pruner`), a model's logit scale
(:mod:`.scale`), the ladder read back (:mod:`.reading`) and stability at the target
(:mod:`.outlook`).

Depends on the statistics and the attr names only; no storage, process or torch code.
"""
