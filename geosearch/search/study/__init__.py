"""The study: :func:`.run.run_search`, the ask → tell loop (:mod:`.trial_loop`), a trial's runs
(:mod:`.runs`), one trial's runner as ``objective`` uses it (:mod:`.optimize`), the queue,
failures and dead-trial recovery (:mod:`.failures`), the preflight and resume
(:mod:`.resume`), extras and baselines, and the export of the answer (:mod:`.export`).
"""
