"""The study: :func:`.run.run_search`, the ask → tell loop (:mod:`.trial_loop`), one trial's
runner as ``objective`` uses it (:mod:`.optimize`), the queue, failures and recovery,
resume, extras and baselines, and the export of the answer (:mod:`.export`).
"""
