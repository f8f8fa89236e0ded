"""Tests of geosearch.search.study.resume: what would fail every trial is refused before
the study is touched, naming the space's key.

The refusals end to end (one line, exit 2, nothing written) are in tests/faults/test_bad_inputs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _search_helpers import TINY_PROXY, make_space

from geosearch.util.errors import SettingsError
from geosearch.search.study.resume import preflight


USER_MODEL = Path(__file__).resolve().parents[2] / "_user_model.py"
USER_RULES = [{"type": "attn_qkv", "pattern": r"\.mix\.qkv\.weight$", "family": "attn"},
              {"type": "attn_out", "pattern": r"\.mix\.out\.weight$", "family": "attn"},
              {"type": "mlp_in", "pattern": r"\.ff\.up\.weight$", "family": "mlp"},
              {"type": "mlp_out", "pattern": r"\.ff\.down\.weight$", "family": "mlp"}]


def test_preflight_splits_the_batch_over_the_processes_of_a_launch():
    preflight(make_space(proxy={**TINY_PROXY, "batch_size": 4, "grad_accum": 2}), processes=2)
    # Rule: each process's rows must split into grad_accum micro-batches.
    with pytest.raises(SettingsError, match=r"^test space: proxy.grad_accum: global batch 4 does not split "
                                            r"over 2 processes x 4 micro-batches; expected one of: 1, 2$"):
        preflight(make_space(proxy={**TINY_PROXY, "batch_size": 4, "grad_accum": 4}), processes=2)


def test_preflight_runs_a_py_model_for_real_when_its_forward_cannot_run_on_the_meta_device():
    def space(factory):
        return make_space(rules=USER_RULES, proxy={**TINY_PROXY, "model": f"py:{USER_MODEL}:{factory}"})

    preflight(space("checked"))  # keeps the contract: built for real on the CPU, it passes
    # Rule: a py: model whose logits are not the data's vocabulary is refused before any
    # trial, naming the space's key, even when only a real forward can show it.
    with pytest.raises(SettingsError, match=r"^test space: proxy.model: model 'py:.*checked_ignores_vocab': "
                                            r"forward\(idx\) returned logits of shape \(2, 128, 100\), "
                                            r"expected \(2, 128, 256\)"):
        preflight(space("checked_ignores_vocab"))
