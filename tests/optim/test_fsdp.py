"""ManifoldMuon under FSDP2 (``fully_shard``): sharded weights step as whole matrices.

One two-rank CPU run (gloo, ``_fsdp_ranks.py``) is compared with one process training the
same model from the same init on the same batches. Both ranks see the whole batch: FSDP2
then averages two equal gradients, so the gradients are one process's up to rounding and
any difference comes from the optimizer. (With half a batch per rank the gradients agree
to 3e-7 relative, but five steps of AdamW and Newton–Schulz at these step sizes amplify
that to 1e-3, too loose to tell a wrong slice from rounding.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _fsdp_ranks import (ASSIGN_PROJECT, RESUME_AT, STEPS, batches, counting_steps, duals,
                         make_model, optimizer, train_step)
from _torchrun import run_two
from torch import nn

from geosearch.util.errors import ConfigError
from geosearch.manifolds import get_manifold
from geosearch.optim import ManifoldMuon, block_view

SCRIPT = Path(__file__).with_name("_fsdp_ranks.py")
# weight -> its blocks' geometries (None: no constraint), as _fsdp_ranks.ASSIGN gives them
GEOMETRIES = {"attn.c_attn.weight": ("stiefel", "dgram", None), "mlp.c_fc.weight": ("dgram",),
              "mlp.c_proj.weight": ("stiefel",)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp") / "out.pt"
    run_two(SCRIPT, str(out))
    return torch.load(out, weights_only=False)


def _trained_in_one_process(*assign):
    """Train the model in this process, counting the batched steps: (start weights, final
    weights, model, optimizer, [matrices, calls])."""
    import geosearch.optim.grouped as grouped

    model = make_model()
    opt = optimizer(model, *assign)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    step_batch = grouped.step_batch
    try:
        computed = counting_steps()
        for x in batches():
            train_step(model, opt, x)
    finally:
        grouped.step_batch = step_batch
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    return start, final, model, opt, computed


@pytest.fixture(scope="module")
def one_process():
    start, final, model, opt, computed = _trained_in_one_process()
    return {"start": start, "final": final, "duals": duals(model, opt), "computed": computed[0]}


@pytest.fixture(scope="module")
def one_process_project():
    """One process with the project solver everywhere: final weights, [matrices, calls]."""
    _, final, _, _, computed = _trained_in_one_process(ASSIGN_PROJECT)
    return {"final": final, "computed": list(computed)}


@pytest.mark.slow
def test_ddp_with_the_project_solver_cuts_every_batch_among_the_ranks(two_ranks,
                                                                      one_process_project):
    run = two_ranks["ddp_project"]
    (m0, calls0), (m1, calls1) = run["computed"]
    matrices, calls = one_process_project["computed"]
    # Rule: with the project solver the batches (here every layer's two matrices of one
    # shape and geometry) are cut into two runs of about equal arithmetic, one per rank: the
    # two together compute each matrix once, each a part, with one batch a step cut at most
    assert m0 + m1 == matrices and m0 > 0 and m1 > 0
    assert calls <= calls0 + calls1 <= calls + STEPS
    for name, ref in one_process_project["final"].items():
        # ... and the weights are one process's (the project solver: to rounding).
        torch.testing.assert_close(run["final"][name], ref, rtol=0, atol=1e-5, msg=name)


@pytest.mark.slow
def test_each_matrix_is_computed_once_across_the_ranks(two_ranks, one_process):
    rank0, rank1 = two_ranks["computed"]
    # Rule: the ranks divide the batches of matrices among them (each batch to one owner,
    # which shares the result): together they compute what one process does, each a part.
    assert rank0 + rank1 == one_process["computed"]
    assert rank0 > 0 and rank1 > 0


@pytest.mark.slow
def test_under_ddp_each_matrix_is_stepped_once_and_the_run_is_one_process_s(two_ranks, one_process):
    ddp = two_ranks["ddp"]
    rank0, rank1 = ddp["computed"]
    # Rule: the DDP ranks divide the matrices as FSDP2's do: each computes a part, and
    # together exactly what one process computes ...
    assert rank0 + rank1 == one_process["computed"] and rank0 > 0 and rank1 > 0
    for name, ref in one_process["final"].items():
        # ... and the broadcast results are one process's weights.
        torch.testing.assert_close(ddp["final"][name], ref, rtol=0, atol=1e-5, msg=name)
    # Rule: every rank holds the same optimizer state (momenta, Λ, AdamW moments), so a
    # checkpoint written by one rank resumes every rank, exactly.
    assert ddp["symmetric"]
    for name, w in ddp["final"].items():
        assert torch.equal(ddp["resumed"][name], w), name


@pytest.mark.slow
def test_the_run_shards_as_described(two_ranks):
    # Precondition: the layouts the comparisons below are meant to cover (uneven rows
    # cutting Q/K/V inside K, and a column-sharded weight) are the ones FSDP2 made.
    placements = two_ranks["placements"]
    assert placements["transformer.h.1.attn.c_attn.weight"] == "(Shard(dim=0),)"
    assert placements["transformer.h.0.mlp.c_proj.weight"] == "(Shard(dim=1),)"
    assert two_ranks["final"]["transformer.h.1.attn.c_attn.weight"].shape == (63, 21)  # 32 + 31 rows


def test_sharded_training_matches_one_process(two_ranks, one_process):
    for name, ref in one_process["final"].items():
        # Rule: placed on the manifolds at construction exactly as one process places them ...
        torch.testing.assert_close(two_ranks["start"][name], one_process["start"][name], rtol=0, atol=1e-6)
        # ... and after 5 steps (stiefel, dgram, euclidean blocks, adamw) the whole weights
        # are one process's to 1e-5, though every weight moved by far more than that.
        torch.testing.assert_close(two_ranks["final"][name], ref, rtol=0, atol=1e-5, msg=name)
        assert (ref - one_process["start"][name]).abs().max() > 1e-2, name


def test_sharded_weights_stay_on_their_manifolds(two_ranks):
    checked = 0
    for layer in range(2):
        for weight, geometries in GEOMETRIES.items():
            W = two_ranks["final"][f"transformer.h.{layer}.{weight}"]
            blocks = block_view(W, len(geometries)) if len(geometries) > 1 else W[None]
            for block, geometry in zip(blocks, geometries, strict=True):
                if geometry is not None:
                    # Rule: each block of the gathered weight satisfies its constraint to 1e-5.
                    assert get_manifold(geometry).constraint_error(block) <= 1e-5, (layer, weight, geometry)
                    checked += 1
    assert checked == 8


def test_warm_started_dual_state_is_one_process_s_on_every_rank(two_ranks, one_process):
    rank0, rank1 = two_ranks["duals"]
    for name, ref in one_process["duals"].items():
        # Rule: Λ is computed from the whole matrix: equal on both ranks, and one process's.
        assert torch.equal(rank0[name], rank1[name]), name
        torch.testing.assert_close(rank0[name], ref, rtol=0, atol=1e-5)
        assert ref.abs().max() > 1e-3  # it is there to compare


def test_resuming_from_the_state_dicts_continues_identically(two_ranks):
    # Rule: model and optimizer state dicts saved after step RESUME_AT and loaded into another
    # sharded model and optimizer (momenta as DTensors, Λ, AdamW moments) finish the same.
    assert 0 < RESUME_AT < len(batches())
    for name, w in two_ranks["final"].items():
        assert torch.equal(two_ranks["resumed"][name], w), name


def test_replicated_weights_and_mixed_adamw_groups_step_as_plain_tensors(two_ranks):
    for local, plain in two_ranks["replicated"]:
        # Rule: a Replicate() DTensor is stepped as the plain tensor, on each rank.
        assert torch.equal(local, plain)
    # Rule: one AdamW group may hold sharded and plain tensors; they step alike.
    sharded, plain = two_ranks["mixed"]
    torch.testing.assert_close(sharded, plain, rtol=0, atol=1e-7)


def test_unsupported_layouts_are_refused_in_one_line(two_ranks):
    refused = two_ranks["refused"]
    assert refused["hsdp_layout"] == "2-D (Replicate(), Shard(dim=0))"  # HSDP: replicate x shard
    for key in ("hsdp", "hsdp_muon", "fsdp1"):
        assert "\n" not in refused[key], key
    # Rule: build_optimizer names the weight and its layout, and says what is supported ...
    assert refused["hsdp"].startswith("build_optimizer: transformer.h.0.attn.c_attn.weight: a DTensor on a "
                                      "2-D device mesh, placements (Replicate(), Shard(dim=0))")
    assert "1-D device mesh with a Shard or Replicate placement" in refused["hsdp"]
    # ... ManifoldMuon alone names the param group ...
    assert refused["hsdp_muon"].startswith("ManifoldMuon: params: param group 0 (c_fc): a weight is a DTensor "
                                           "on a 2-D device mesh")
    # ... and FSDP1's flat parameters are refused before anything is bound.
    assert refused["fsdp1"] == ("build_optimizer: the model is wrapped in FSDP1 (FullyShardedDataParallel), whose "
                                "flat parameter shards manifold Muon cannot step; shard it with FSDP2's fully_shard "
                                "instead")


def test_flat_shards_handed_over_after_construction_are_refused_in_one_line():
    # What DeepSpeed ZeRO does to a client optimizer (simulated: DeepSpeed is not installed):
    # it replaces each group's weights by a flat 1-D partition after construction.
    model = make_model()
    opt = ManifoldMuon([{"params": [model.transformer.h[0].mlp.c_fc.weight], "geometry": "stiefel"}])
    flat = nn.Parameter(model.transformer.h[0].mlp.c_fc.weight.detach().flatten().clone())
    flat.grad = torch.ones_like(flat)
    opt.param_groups[0]["params"] = [flat]
    with pytest.raises(ConfigError, match=r"^ManifoldMuon: params: param group 0: a manifold-Muon weight became a "
                                          r"tensor of shape \(1764,\) .*DeepSpeed ZeRO.*fully_shard$") as e:
        opt.step()
    assert "\n" not in str(e.value)
