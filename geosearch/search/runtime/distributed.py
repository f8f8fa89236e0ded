"""Data-parallel trials: every process of a distributed launch trains each trial together.

Launched as ``torchrun --nproc_per_node N -m geosearch search ...`` (CPU, gloo) or
``accelerate launch --multi_gpu --num_processes N -m geosearch search ...`` (GPUs), the N
processes split each trial's global batch (:func:`geosearch.proxy.train.train` does the
split). Rank 0 alone talks to Optuna: it opens the study, asks for a trial, and before
every proxy run sends the run's :class:`~geosearch.proxy.train.TrainConfig` and
:class:`~geosearch.assignment.Assignment` to the other ranks; they train with it
(``train`` broadcasts rank 0's callback verdict at every record step, so a pruned trial
stops on every rank at the same step) and wait for the next message. When the study is
done rank 0 sends ``stop``; when it fails between runs it sends ``error`` with its
message, so every rank ends with it. Messages go through
``accelerate.utils.broadcast_object_list``.

Failure modes, and what ends the others:

* Ctrl-C in a terminal reaches every rank: rank 0 fails and queues its trial (as one
  process does), every rank exits with code 130, ``torchrun`` with an error of its own.
* A rank that dies (killed, out of memory) leaves the others inside a collective:
  ``torchrun`` (and ``accelerate launch``, which runs it) stops them as soon as it sees the
  dead one; under any other launcher the process-group timeout does
  (``GEOSEARCH_DIST_TIMEOUT`` seconds, see :func:`geosearch.proxy.train.get_accelerator`).
  The trial is left RUNNING and the next run of the study takes it as stale; when the
  backend tells rank 0 first (gloo: "connection closed by peer"), rank 0 records it as a
  failure of the environment and queues it again. Either way the point runs again.
* An error on rank 0 only, raised inside a proxy run (e.g. its storage failing in the
  callback), is broadcast with the verdict: every rank leaves the run together.
"""

from __future__ import annotations

import os
from typing import Any

from geosearch.util.errors import GeosearchError

__all__ = ["RankGroup", "follow", "launch_world", "leave_together"]


def launch_world() -> tuple[int, int]:
    """``(rank, world size)`` as set by ``torchrun`` / ``accelerate launch``; ``(0, 1)``
    in a plain process. Read from the environment: nothing is initialised."""
    try:
        return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


class RankGroup:
    """The processes of one distributed launch, as the search sees them.

    Args:
        accelerator: the process's ``Accelerator`` (``get_accelerator``), whose process
            group carries the messages.
    """

    def __init__(self, accelerator: Any) -> None:
        self.accelerator = accelerator
        self.rank, self.world = accelerator.process_index, accelerator.num_processes
        # rank 0's view: whether the other ranks wait for a message (not inside a run)
        self.waiting = True

    def _broadcast(self, message: dict | None) -> dict:
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([message])[0]

    def send(self, kind: str, **payload: Any) -> None:
        """Rank 0: send ``{"kind": kind, **payload}`` to every other rank."""
        self._broadcast({"kind": kind, **payload})

    def receive(self) -> dict:
        """Other ranks: the next message of rank 0."""
        return self._broadcast(None)

    def train(self, train_fn, config, assignment, **kwargs):
        """Rank 0: announce a proxy run, then train it (the others train alongside)."""
        self.send("train", config=config, assignment=assignment)
        self.waiting = False
        try:
            result = train_fn(config, assignment, **kwargs)
        except Exception:
            # Raised before training started (every rank raises the same, e.g. a config the
            # model refuses) or by the callback (broadcast by ``train``): the other ranks
            # have left the run too.
            self.waiting = True
            raise
        self.waiting = True
        return result

    def stop(self, reason: str) -> None:
        """Rank 0: the search is over; the other ranks return ``reason``."""
        self.send("stop", reason=reason)

    def fail(self, error: BaseException) -> None:
        """Rank 0: the search failed between runs; the other ranks raise its message.

        Sends nothing when the others are inside a run (they would not receive it): they
        end with rank 0's exit (torchrun) or the process-group timeout.
        """
        if self.waiting:
            self.send("error", message=str(error), type=type(error).__name__)


def follow(group: RankGroup, train_fn) -> str:
    """The loop of every rank but 0: train what rank 0 announces until it says stop.

    Returns:
        Rank 0's stop reason.

    Raises:
        GeosearchError: rank 0 stopped with an error (its message).
    """
    while True:
        message = group.receive()
        kind = message["kind"]
        if kind == "stop":
            return message["reason"]
        if kind == "error":
            raise GeosearchError(f"stopped with rank 0: {message['message']}")
        if kind != "train":  # pragma: no cover - a message of a newer rank 0
            raise GeosearchError(f"unknown message {kind!r} from rank 0")
        try:
            # rank 0 writes the files and calls the callback; its verdict reaches us in train
            train_fn(message["config"], message["assignment"])
        except Exception:  # noqa: BLE001 - rank 0 met it too and fails the trial
            continue


def leave_together() -> None:
    """End a distributed launch on every rank at the same point: a barrier (rank 0 has
    written its export and report by then), then the process group is destroyed before
    the interpreter shuts down. A rank that left earlier, with the group still alive,
    could abort (SIGABRT from gloo's threads) while its peer was still working. No-op in
    a plain process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

