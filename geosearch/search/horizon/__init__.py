"""The horizon: Σ η and the ladder (:mod:`.ladder`), the max-logit forecast (:mod:`.forecast`),
the logit-growth pruner (:mod:`.pruner`), the target run (:mod:`.target`) and stability at
the target (:mod:`.outlook`).

Depends on the statistics and the attr names only; no storage, process or torch code.
"""
