"""The search-space file: the space (:mod:`.spec`), its YAML schema (:mod:`.schema`, read with
:mod:`.reader`), its sections (:mod:`.sections`, the ``target:`` and ``ladder:`` ones in
:mod:`.horizon`), the baselines it names (:mod:`.baseline_specs`), the study plan worked out from
it (:mod:`.plan`) and the shipped spaces (``spaces/*.yaml``).
"""
