"""Tests of benchmarks/gpu_check.py: its CPU fallback end to end (quick sizes), and the
verdicts it draws from the numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gpu_check  # noqa: E402


def test_cpu_fallback_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.md"
    code = gpu_check.main(["--quick", "--device", "cpu", "--out", str(out)])
    text = out.read_text()
    # Rule: without CUDA the table says it is the CPU fallback, and has the four parts.
    assert "CPU fallback" in text
    for section in ("## (a) Default search in bf16", "## (b) bf16 against fp32", "## (c) Optimizer step",
                    "## (d) msign and retractions"):
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
    # Rule: the exit code is 0 exactly when every check says ok.
    checks = text.split("Checks: ", 1)[1].split("\n", 1)[0]
    assert (code == 0) == ("FAIL" not in checks)


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
