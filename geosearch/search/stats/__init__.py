"""The statistics of the answer: scores and their tests (:mod:`.scores`), the blocked
assignment + seed noise model (:mod:`.blocked`), a trial read as a score, a point and a line
(:mod:`.trials`), the ranking of a study's assignments (:mod:`.ranking`) and the adaptive
seed plan (:mod:`.seeding`).

Depends on nothing of the study but the attr names (:mod:`geosearch.search.records`);
:mod:`.scores` and :mod:`.blocked` import neither Optuna nor torch.
"""
