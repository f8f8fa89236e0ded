"""What a study runs on: storage URLs and the journal (:mod:`.storage`, :mod:`.journal`), locks
(:mod:`.locks`), heartbeats and liveness (:mod:`.liveness`), interrupts (:mod:`.interrupts`),
worker processes (:mod:`.workers`), ranks (:mod:`.distributed`), and what a trial leaves
beside the storage: its backup record and its files as artifacts (:mod:`.backup`). Knows
nothing of what a trial trains.
"""
