"""The statistics of the answer: scores and their tests (:mod:`.scores`), the ranking of a
study's assignments (:mod:`.ranking`) and the adaptive seed plan (:mod:`.seeding`).

Depends on nothing of the study but the attr names (:mod:`geosearch.search.records`);
:mod:`.scores` imports neither Optuna nor torch.
"""
