"""Tests of benchmarks/gpu_check.py: its CPU fallback end to end (quick sizes), and the
verdicts it draws from the numbers."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_check  # noqa: E402
from optimizer_step import COMPILE_VARIANTS  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_plots")  # no test here checks a plot: tests/_no_plots.py


@pytest.mark.slow
def test_cpu_fallback_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.md"
    # --default-search: off by default with --quick, on here to run (f)'s code path (tiny sizes)
    code = gpu_check.main(["--quick", "--device", "cpu", "--default-search", "--out", str(out)])
    text = out.read_text()
    # Rule: without CUDA the table says it is the CPU fallback, and has the seven parts.
    assert "CPU fallback" in text
    for section in ("## (a) Default search in bf16", "## (b) bf16 against fp32", "## (c) Optimizer step",
                    "## (d) msign and retractions", "## (e) Runs side by side",
                    "## (f) The default search", "## (g) Training step against Muon"):
        assert section in text
    # (a) the bf16 search ran both points of the quick space to completion.
    assert "| 2 | completed 2 |" in text
    # (b) three runs: bf16 seed 0, fp32 seeds 0 and 1, each with a final loss.
    assert text.count("| completed |") == 3
    # (c) a row for each baseline and each geometry × solver, with the precision of each:
    # fp32 weights (a bf16 mixed-precision run's optimizer step) and bf16 weights.
    for row in ("| torch AdamW | adamw | — | fp32 |", "| torch Muon | euclidean | NS (Keller) | fp32 | bf16 |",
                "| ManifoldMuon | adamw |", "| torch Muon | euclidean | NS (Keller) | bf16 | bf16 |"):
        assert row in text
    for geometry in gpu_check.TIMED_GEOMETRIES:
        for solver in ("project", "dual"):
            assert f"| ManifoldMuon | {geometry} | {solver} | fp32 | fp32 |" in text
        assert f"| ManifoldMuon | {geometry} | project | bf16 | fp32 |" in text
    assert text.count("| msign alone |") == 2
    # (d) msign and each retraction at each shape.
    assert text.count("| msign |") == 2
    for name in gpu_check.RETRACTED:
        assert text.count(f"| retract {name} |") == 2
    # (e) a row per k of the quick list (1, 2), every run timed, and a saturation line.
    assert "| 1 | 1/1 |" in text and "| 2 | 2/2 |" in text
    assert "Saturates at k = 1" in text or "Does not saturate up to k = 2" in text
    assert "say nothing about a GPU" in text
    # (f) the default space's search (at tiny sizes) ran to a verdict: 2 points x (stability + 2 seeds)
    assert "| steps trained | 24 of the 24 planned, in 6 proxy runs |" in text
    assert "| check | ok" in text.split("## (f)", 1)[1]
    # (g) each geometry grouped and ungrouped beside both Muons, with the operation counts
    train = text.split("## (g)", 1)[1]
    for row in ("| tiny | euclidean (Muon) | torch.optim.Muon |", "| tiny | all-DGram | grouped |",
                "| tiny | attn Stiefel + MLP DGram | ungrouped (previous) |"):
        assert row in train
    assert "optimizer ops ÷" in train
    # (g) with torch.compile: every variant of both assignments, the compiled ones equal to
    # eager in loss (|Δ loss| is the table's second-to-last column) and on the manifold
    compiled = train.split("### (g) with torch.compile", 1)[1]
    for variant in COMPILE_VARIANTS:
        for geometry in ("Muon fp32 (euclidean, quintic)", "attn Stiefel + MLP DGram"):
            row = next(r for r in compiled.splitlines()
                       if r.startswith(f"| tiny | {geometry} | {variant} |"))
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert float(cells[-2]) < 1e-4, row
            assert cells[-1] == "—" if geometry.startswith("Muon") else float(cells[-1]) < 1e-5
    # Rule: the exit code is 0 exactly when every check says ok.
    checks = text.split("Checks: ", 1)[1].split("\n", 1)[0]
    assert "runs side by side ok" in checks and "default search ok" in checks
    assert (code == 0) == ("FAIL" not in checks)


def test_the_default_search_is_on_by_default_only_on_cuda_at_full_sizes():
    # Rule: on the CPU it takes about 8 minutes, and --quick is for tests: off there.
    assert not gpu_check.parse_args(["--device", "cpu"]).default_search
    assert not gpu_check.parse_args(["--quick", "--device", "cpu"]).default_search
    assert gpu_check.parse_args(["--device", "cpu", "--default-search"]).default_search


def test_the_k_values_are_a_flag():
    assert gpu_check.parse_args(["--device", "cpu", "--concurrency", "4,1,2"]).concurrency == (1, 2, 4)
    assert gpu_check.parse_args(["--device", "cpu", "--concurrency", "none"]).concurrency == ()
    assert gpu_check.parse_args(["--device", "cpu"]).concurrency == (1, 2)


@pytest.mark.slow
def test_a_search_past_its_timeout_is_stopped_and_reported(monkeypatch):
    monkeypatch.setitem(gpu_check.MIN_SEARCH, "quick", 0.0)  # below it the search is skipped
    args = gpu_check.parse_args(["--quick", "--device", "cpu", "--default-search"])
    plan = gpu_check.search_plan(quick=True)
    start = time.perf_counter()
    result = gpu_check.default_search(args, start + 2.0, plan, (1.0, 2.0))
    # Rule: a child has a timeout; past it the search is stopped (Ctrl-C, then killed) and
    # reported as timed out, neither raised nor counted as a failed check.
    assert time.perf_counter() - start < 2.0 + gpu_check.SEARCH_GRACE
    assert result["timed_out"] is not None and result["rc"] is not None
    text, check = gpu_check.default_search_section(result, "")
    assert check == "timed out" and "timed out after 2 s" in text


def _round(k: int, steps_per_s: float, ok: bool = True) -> dict:
    runs = [{"ms": 1e3 * k / steps_per_s, "steps_per_s": steps_per_s / k, "peak_mib": None, "in_use_mib": None}] * k
    return {"k": k, "ok": ok, "runs": runs if ok else runs[:-1], "errors": [] if ok else ["run 1: exit code 1: boom"],
            "overlap": 1.0, "steps_per_s": steps_per_s}


@pytest.mark.parametrize("aggregates, line", [
    ({1: 10, 2: 19, 4: 30, 8: 32, 16: 31}, "Saturates at k = 4"),  # 4 -> 8 adds 7%
    ({1: 10, 2: 10.5}, "Saturates at k = 1"),
    ({1: 10, 2: 19, 4: 30}, "Does not saturate up to k = 4"),
    ({1: 10}, "not measured"),
])
def test_saturation_is_the_k_after_which_the_aggregate_grows_less_than_10_percent(aggregates, line):
    text, check = gpu_check.concurrency_section([_round(k, v) for k, v in aggregates.items()], fallback=False)
    # Rule: saturates at k when the next k in the list adds less than 10% to the sum of steps/s.
    assert line in text and check == "ok"
    assert "--workers" in text and "all k workers land on it" in text


def test_a_failed_or_skipped_round_is_reported_not_raised():
    rounds = [_round(1, 10), _round(2, 19, ok=False), {"k": 4, "skipped": "no time"}]
    text, check = gpu_check.concurrency_section(rounds, fallback=False)
    # Rule: a failed run fails the check with its message; a skipped k is said, not failed.
    assert check == "FAIL" and "boom" in text and "skipped: no time" in text
    text, check = gpu_check.concurrency_section([{"k": 1, "skipped": "no time"}], fallback=False)
    assert check == "skipped"
    # Rule: a k stopped at the part's end (out of budget, or hung) is said, not failed.
    cut = {**_round(2, 19, ok=False), "cut": True, "errors": ["run 1: timed out after 60 s"]}
    text, check = gpu_check.concurrency_section([_round(1, 10), cut], fallback=False)
    assert check == "timed out" and "cut: the part's time ran out (run 1: timed out after 60 s)" in text


def _children(bf16: float, fp32: tuple[float, float], status: str = "completed") -> list[dict]:
    run = lambda seed, loss: {"seed": seed, "status": status, "loss": loss, "ms": 1.0, "tokens_per_s": 1.0}  # noqa: E731
    return [{"precision": "bf16", "runs": [run(0, bf16)]},
            {"precision": "no", "runs": [run(0, fp32[0]), run(1, fp32[1])]}]


@pytest.mark.parametrize("bf16, fp32, ok", [
    (3.01, (3.00, 3.00), True),    # within the 0.03 floor
    (3.05, (3.00, 3.00), False),   # beyond the floor, seeds agree
    (3.05, (3.00, 3.04), True),    # within 2 × the seed-to-seed gap (0.08)
    (3.10, (3.00, 3.04), False),   # beyond it
])
def test_bf16_is_judged_against_the_fp32_seed_noise(bf16, fp32, ok):
    text, verdict = gpu_check.precision_section(_children(bf16, fp32))
    # Rule: tolerance = max(0.03, 2 × |fp32 seed 0 − fp32 seed 1|).
    assert verdict is ok
    assert ("ok" if ok else "FAIL") in text.splitlines()[-1]


def test_a_child_that_failed_fails_its_checks():
    children = [{"precision": "bf16", "error": "exit code 1: CUDA error"}, _children(3.0, (3.0, 3.0))[1]]
    # Rule: a failed child process is a failed check, with its message.
    for section in (gpu_check.search_section, gpu_check.precision_section):
        text, ok = section(children)
        assert not ok and "CUDA error" in text
