"""The search-space file: the space (:mod:`.spec`), its YAML schema (:mod:`.schema`, read with
:mod:`.reader`), its sections (:mod:`.sections`), the baselines it names (:mod:`.baselines`)
and the shipped spaces (``spaces/*.yaml``).
"""
