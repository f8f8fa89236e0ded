"""Every bad input of ``_bad_inputs.CASES`` ends as one bounded line, exit 2, nothing written;
and the table of them in ``docs/reliability.md`` is the one these runs print."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from _bad_inputs import CASES, run_case, table

from geosearch.search.space.spec import load_space, space_names

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reliability.md"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_a_bad_input_is_one_bounded_line_exit_2_and_writes_nothing(case, tmp_path):
    if case.cpu_only and torch.cuda.is_available():
        pytest.skip("a bad input only on a machine without CUDA")
    outcome = run_case(case, tmp_path)
    assert outcome.problems() == [], f"{case.what}: {outcome.stderr}{outcome.stdout[-500:]}"


@pytest.mark.slow
def test_the_table_in_docs_is_the_one_the_cases_print(tmp_path):
    """Regenerate with ``python benchmarks/chaos.py --inputs --write``."""
    rows = [(case, run_case(case, tmp_path / str(i))) for i, case in enumerate(CASES)]
    fresh = table(rows, tmp_path).splitlines()
    text = DOC.read_text(encoding="utf-8")
    start = text.index("| # | bad input |")
    documented = text[start:].split("\n\n")[0].splitlines()
    assert len(documented) == len(fresh) >= 32
    for case, doc_row, new_row in zip([None, None, *CASES], documented, fresh):
        if case is not None and case.cpu_only and torch.cuda.is_available():
            continue
        if case is not None and case.volatile:  # a library's words: the start must agree
            doc_row, new_row = (re.sub(r"\(.*", "", r) for r in (doc_row, new_row))
        # the installed transformers' version is named by some rows: any checked one will do
        doc_row, new_row = (re.sub(r"transformers \d+\.\d+\.\d+", "transformers X.Y.Z", r)
                            for r in (doc_row, new_row))
        assert doc_row == new_row


def test_a_directory_named_like_a_shipped_space_does_not_shadow_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in space_names():
        (tmp_path / name).mkdir()  # `geosearch search` with no --space loads "default"
    assert load_space("default").name == "default"
    assert load_space("paper").source.endswith("paper.yaml")
    # a file of a shipped name is still reachable, as a path
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "default").write_text(
        "version: 1\nname: own\ngeometries: {attn: [adamw], mlp: [adamw]}\n", encoding="utf-8")
    assert load_space(str(Path("mine") / "default")).name == "own"
