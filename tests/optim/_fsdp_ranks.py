"""The two-rank FSDP2 run of ``test_fsdp.py`` (``torchrun --nproc_per_node 2``, gloo, CPU),
and the setup it shares with the test's one-process reference.

A ``tiny`` GPT with odd widths (so shards are uneven) is sharded with ``fully_shard``, by
rows (FSDP2's default ``Shard(0)``, which cuts the fused Q/K/V weight (63, 21) inside its
K block), but layer 0's ``mlp.c_proj`` (21, 84), by columns (``Shard(1)``). Each rank trains on its
half of every batch. The run writes (rank 0) what the test compares: the whole weights
after the steps, the same after a resume from the state dicts saved midway, both ranks'
dual variables, and the messages of the layouts that must be refused.

Usage: ``python -m torch.distributed.run --nproc_per_node 2 _fsdp_ranks.py OUT.pt``
"""

from __future__ import annotations

import copy
import os
import sys

import torch
from torch import nn

from geosearch.assignment import Assignment
from geosearch.build import build_optimizer
from geosearch.util.errors import ConfigError
from geosearch.models.lm import lm_loss
from geosearch.models.model import GPT, make_config
from geosearch.optim import ManifoldMuon

STEPS, RESUME_AT = 5, 3
# stiefel, dgram (one with dual ascent, warm-started), euclidean (plain Muon), adamw; the
# fused Q/K/V weight mixes three geometries.
ASSIGN = ("attn_q=stiefel,attn_k=dgram,attn_v=euclidean,attn_out=adamw,mlp_in=dgram,mlp_out=stiefel,"
          "mlp_in.solver=dual,mlp_in.warm_start=true,mlp_in.dual_steps=5")
# the same with the project solver everywhere: batches are then cut into one part per rank
ASSIGN_PROJECT = ASSIGN.split(",mlp_in.solver")[0]
SETTINGS = dict(spectral_lr=0.05, lr=1e-2)  # large steps, so that the weights move visibly
DUAL = "transformer.h.{}.mlp.c_fc.weight"  # the warm-started dual variables, per layer


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return GPT(make_config("tiny", n_embd=21, n_head=3, vocab_size=255, block_size=16, bias=False))


def optimizer(model: nn.Module, assign: str = ASSIGN, **kwargs) -> ManifoldMuon:
    return build_optimizer(model, Assignment.parse(assign, "nanogpt_split"), verbose=False,
                           **SETTINGS, **kwargs)


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(255, (4, 17), generator=g) for _ in range(STEPS)]


def train_step(model: nn.Module, opt: ManifoldMuon, x: torch.Tensor) -> None:
    opt.zero_grad()
    lm_loss(model, x[:, :-1], x[:, 1:]).backward()
    opt.step()


def duals(model: nn.Module, opt: ManifoldMuon) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    return {DUAL.format(i): opt.state[params[DUAL.format(i)]]["dual"] for i in range(2)}


def counting_steps() -> list[int]:
    """Count the matrices each call of the grouped step computes (in this process, from now
    on): a list holding the running total, then the number of calls."""
    import geosearch.optim.grouped as grouped

    total, step_batch = [0, 0], grouped.step_batch

    def counted(manifold, members, step):
        total[0] += sum(m.weight.shape[0] for m in members)
        total[1] += 1
        return step_batch(manifold, members, step)

    grouped.step_batch = counted
    return total


def _shard(model: nn.Module, mesh) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard

    for i, block in enumerate(model.transformer.h):
        # FSDP2 shards dim 1 only when it divides evenly: layer 0's mlp.c_proj (21, 84)
        by_columns = (lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % 2 == 0 else None) if i == 0 else None
        fully_shard(block, mesh=mesh, shard_placement_fn=by_columns)
    fully_shard(model, mesh=mesh)


def _whole(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.full_tensor().clone() for n, p in model.named_parameters()}


def _replicated_against_plain(mesh) -> tuple[torch.Tensor, torch.Tensor]:
    """(the Replicate() weight's local copy, the plain weight) after the same 3 dual-ascent
    DGram steps, warm-started, from the same start and gradients."""
    from torch.distributed.tensor import Replicate, distribute_tensor

    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(12, 7, generator=g)
    plain = nn.Parameter(w0.clone())
    replicated = nn.Parameter(distribute_tensor(w0.clone(), mesh, [Replicate()]))
    group = {"geometry": "dgram", "solver": "dual", "warm_start": True, "lr": 0.05}
    opts = [ManifoldMuon([{**group, "params": [p]}]) for p in (plain, replicated)]
    for _ in range(3):
        grad = torch.randn(12, 7, generator=g)
        plain.grad, replicated.grad = grad.clone(), distribute_tensor(grad.clone(), mesh, [Replicate()])
        for opt in opts:
            opt.step()
    return replicated.to_local().detach().clone(), plain.detach().clone()


def _mixed_adamw(mesh) -> tuple[torch.Tensor, torch.Tensor]:
    """(the sharded weight, gathered; the plain one) after 3 steps of one AdamW group that
    holds both (torch's foreach ops refuse lists that mix DTensors and plain tensors)."""
    from torch.distributed.tensor import Shard, distribute_tensor

    g = torch.Generator().manual_seed(4)
    w0 = torch.randn(5, 3, generator=g)
    plain = nn.Parameter(w0.clone())
    shard = nn.Parameter(distribute_tensor(w0.clone(), mesh, [Shard(0)]))
    opt = ManifoldMuon([{"params": [plain, shard], "geometry": "adamw", "lr": 0.01, "weight_decay": 0.1}])
    for _ in range(3):
        grad = torch.randn(5, 3, generator=g)
        plain.grad, shard.grad = grad.clone(), distribute_tensor(grad.clone(), mesh, [Shard(0)])
        opt.step()
    return shard.full_tensor().detach().clone(), plain.detach().clone()


def _ddp_run(xs: list[torch.Tensor]) -> dict:
    """The same training under DDP (plain whole weights on each rank): the final weights, the
    matrices this rank computed, whether its optimizer state is rank 1's, and a resume."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(make_model())
    opt = optimizer(model, ddp_owner_steps=True)
    computed = counting_steps()
    for t, x in enumerate(xs):
        if t == RESUME_AT:
            saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
        train_step(model, opt, x)
    done = computed[0]
    final = {n.removeprefix("module."): p.detach().clone() for n, p in model.named_parameters()}
    states = [None, None]
    dist.all_gather_object(states, opt.state_dict()["state"])
    symmetric = all(
        states[0].keys() == states[1].keys() and all(
            torch.equal(torch.as_tensor(v), torch.as_tensor(states[1][i][k])) for k, v in st.items())
        for i, st in states[0].items())
    other = DistributedDataParallel(make_model(seed=7))
    opt2 = optimizer(other, ddp_owner_steps=True)
    other.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    for x in xs[RESUME_AT:]:
        train_step(other, opt2, x)
    resumed = {n.removeprefix("module."): p.detach().clone() for n, p in other.named_parameters()}
    counts = [None, None]
    dist.all_gather_object(counts, done)
    return {"final": final, "computed": counts, "symmetric": symmetric, "resumed": resumed}


def _ddp_project_run(xs: list[torch.Tensor]) -> dict:
    """DDP with the project solver everywhere: the final weights and, per rank, the
    matrices and the calls of the grouped step it computed."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(make_model())
    opt = optimizer(model, ASSIGN_PROJECT, ddp_owner_steps=True)
    computed = counting_steps()
    for x in xs:
        train_step(model, opt, x)
    counts = [None, None]
    dist.all_gather_object(counts, list(computed))
    final = {n.removeprefix("module."): p.detach().clone() for n, p in model.named_parameters()}
    return {"final": final, "computed": counts}


def _refused(make) -> str:
    try:
        make()
    except ConfigError as e:
        return str(e)
    return "not refused"


def main(out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    xs = batches()

    model = make_model()
    _shard(model, mesh)
    opt = optimizer(model)
    placements = {n: str(p.placements) for n, p in model.named_parameters()}
    start = _whole(model)
    computed = counting_steps()
    for t, x in enumerate(xs):
        if t == RESUME_AT:
            saved = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
        train_step(model, opt, x)
    final = _whole(model)
    rank_computed = [None, None]
    dist.all_gather_object(rank_computed, computed[0])
    rank_duals = [None, None]
    dist.all_gather_object(rank_duals, duals(model, opt))

    # Resume: another model (other init), sharded alike, loads the midway state dicts.
    other = make_model(seed=7)
    _shard(other, mesh)
    opt2 = optimizer(other)
    other.load_state_dict(saved[0])
    opt2.load_state_dict(saved[1])
    for x in xs[RESUME_AT:]:
        train_step(other, opt2, x)
    resumed = _whole(other)

    # A Replicate() DTensor (every rank holds the whole matrix) steps as a plain tensor does.
    replicated = _replicated_against_plain(mesh)

    # Layouts manifold Muon cannot step: a 2-D mesh (HSDP: replicate x shard), FSDP1.
    hsdp = make_model()
    fully_shard(hsdp, mesh=init_device_mesh("cpu", (1, 2), mesh_dim_names=("replicate", "shard")))
    weight = hsdp.transformer.h[0].mlp.c_fc.weight
    refused = {
        "hsdp": _refused(lambda: optimizer(hsdp)),
        "hsdp_layout": f"{weight.device_mesh.ndim}-D {tuple(weight.placements)}",
        "hsdp_muon": _refused(lambda: ManifoldMuon([{"params": [weight], "geometry": "stiefel", "name": "c_fc"}])),
        "fsdp1": _refused(lambda: optimizer(FullyShardedDataParallel(make_model(), device_id=torch.device("cpu")))),
    }
    mixed = _mixed_adamw(mesh)
    ddp = _ddp_run(xs)
    ddp_project = _ddp_project_run(xs)
    rank_replicated = [None, None]
    dist.all_gather_object(rank_replicated, replicated)
    if rank == 0:
        torch.save({"placements": placements, "start": start, "final": final, "resumed": resumed,
                    "duals": rank_duals, "replicated": rank_replicated, "mixed": mixed,
                    "computed": rank_computed, "ddp": ddp, "ddp_project": ddp_project,
                    "refused": refused}, out)
    dist.barrier()  # both ranks done before either tears gloo down
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # as tests/proxy/test_qkclip.py: skip the finalization where gloo's threads abort now and then


if __name__ == "__main__":
    main(sys.argv[1])
