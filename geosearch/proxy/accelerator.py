"""The process's one ``accelerate.Accelerator``, and how long a distributed rank waits.

Accelerate keeps its state in a process-wide singleton, so every proxy run of a process
shares one ``Accelerator`` (:func:`get_accelerator`) and therefore one device and one mixed
precision. Unless a run sets its precision, Accelerate's configuration chooses it (the
variable ``ACCELERATE_MIXED_PRECISION`` that ``accelerate launch`` sets from its flag or from
``accelerate config``); FSDP and DeepSpeed configurations are refused. Under ``torchrun`` or ``accelerate launch`` it joins the process group with a
collective timeout of ``GEOSEARCH_DIST_TIMEOUT`` seconds, so that a rank whose peers died
gives up instead of waiting forever. (``accelerate launch --num_processes 2`` without
``--multi_gpu`` starts one process, on CPUs too: its CPU path needs MPI. Use ``torchrun
--nproc_per_node 2``, or ``accelerate launch --multi_gpu --num_processes 2``, which on a
machine without GPUs starts two CPU processes; :func:`launch_shortfall` says so.)
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import io
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, get_args

import torch

from geosearch.util.errors import SettingsError
from geosearch.proxy.config import Device, Precision

DIST_TIMEOUT_ENV = "GEOSEARCH_DIST_TIMEOUT"
"""Environment variable: seconds a process of a distributed run waits for the others in
one collective before it gives up (default 1800)."""

PRECISION_ENV = "ACCELERATE_MIXED_PRECISION"
"""Accelerate's environment variable for the mixed precision (set by ``accelerate launch``
from ``--mixed_precision`` or from the ``accelerate config`` file)."""
_UNSUPPORTED_ENV = {"ACCELERATE_USE_FSDP": "FSDP", "ACCELERATE_USE_DEEPSPEED": "DeepSpeed"}
_UNSUPPORTED_TYPES = {"FSDP": "FSDP", "DEEPSPEED": "DeepSpeed", "MEGATRON_LM": "Megatron-LM"}

_ACCELERATOR: tuple[tuple[str, str], Any] | None = None


def resolve_precision(mixed_precision: Precision | None) -> str:
    """The precision a run trains in: its own, else Accelerate's configuration, else ``no``.

    Accelerate reads ``ACCELERATE_MIXED_PRECISION`` when ``Accelerator(mixed_precision=None)``
    (``AcceleratorState.__init__`` in accelerate 1.x); this reads it the same way, so that the
    process's one Accelerator can be compared with what a later run asks for.

    Raises:
        SettingsError: the variable holds a value geosearch does not train in (``fp8``).
    """
    if mixed_precision is not None:
        return mixed_precision
    value = os.environ.get(PRECISION_ENV, "no").strip().lower() or "no"
    if value not in get_args(Precision):
        raise SettingsError(f"unsupported mixed precision {value!r}", source=PRECISION_ENV,
                          allowed=get_args(Precision))
    return value


def check_distributed_type() -> None:
    """Refuse the FSDP and DeepSpeed settings of ``accelerate config`` / ``accelerate launch``.

    Raises:
        SettingsError: ``ACCELERATE_USE_FSDP`` or ``ACCELERATE_USE_DEEPSPEED`` is true.
    """
    for env, what in _UNSUPPORTED_ENV.items():
        if os.environ.get(env, "false").strip().lower() in ("1", "true", "yes", "y", "on", "t"):
            raise SettingsError(f"{what} is not supported yet: geosearch trains data parallel "
                                "(DDP); unset it or choose no FSDP/DeepSpeed in `accelerate config`",
                                source=env)


def check_device(device: Device, *, source: str | None = None, key: str | None = "device") -> str:
    """The device a run asking for ``device`` trains on here, ``"cuda"`` or ``"cpu"``.

    ``auto`` is CUDA when a CUDA device is visible, else the CPU.

    Raises:
        SettingsError: ``cuda`` asked for on a machine where none is visible, naming ``source``
            and ``key`` (a file and its key, or a flag).
    """
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise SettingsError("'cuda' asked for, but no CUDA device is visible "
                          "(torch.cuda.is_available() is False)", source=source, key=key,
                          allowed=["auto", "cpu"])
    return "cuda" if device == "cuda" or (device == "auto" and cuda) else "cpu"


def check_precision(device: Device, mixed_precision: Precision | None, *, source: str | None = None,
                    key: str | None = "mixed_precision") -> str:
    """The precision a run asking for ``mixed_precision`` on ``device`` trains in here, or
    the error :func:`get_accelerator` would raise: fp16 needs a CUDA device, bf16 on CUDA
    needs a GPU that supports it (``torch.cuda.is_bf16_supported()``, as Accelerate checks).
    Creates nothing: the search checks its precision with it before any trial.

    Args:
        device: the run's device (``auto``, ``cpu``, ``cuda``).
        mixed_precision: the run's; None = Accelerate's configuration
            (:func:`resolve_precision`), and the error then names its variable.
        source, key: where the value came from (a file and its key, or a flag).

    Raises:
        SettingsError: a precision this machine cannot train in, naming ``source`` and
            ``key`` and the precisions it can.
    """
    where = {"source": source, "key": key} if mixed_precision is not None else {"source": PRECISION_ENV}
    precision = resolve_precision(mixed_precision)
    resolved = check_device(device)
    if precision == "fp16" and resolved != "cuda":
        why = "the device is cpu" if device == "cpu" else "none is visible (torch.cuda.is_available() is False)"
        raise SettingsError(f"fp16 needs a CUDA device, and {why}", **where, allowed=["no", "bf16"])
    if precision == "bf16" and resolved == "cuda" and not torch.cuda.is_bf16_supported():
        raise SettingsError("bf16 needs a GPU that supports it (torch.cuda.is_bf16_supported() is False)",
                            **where, allowed=["no", "fp16"])
    return precision


def get_accelerator(device: Device = "auto", mixed_precision: Precision | None = None):
    """The process's one ``accelerate.Accelerator``, created on first use.

    ``mixed_precision=None`` takes Accelerate's configuration (:func:`resolve_precision`);
    the Accelerator's ``mixed_precision`` is the one used.

    Accelerate keeps its state in a process-wide singleton that cannot change device or
    precision once made (``AcceleratorState._reset_state`` is private), so every run of a
    process must ask for the same ones. Under ``torchrun``/``accelerate launch`` the
    distributed environment is picked up here, with a collective timeout of
    ``GEOSEARCH_DIST_TIMEOUT`` seconds (default 1800, for gloo and NCCL alike): a rank
    whose peers died unnoticed by the launcher gives up after it.

    Raises:
        SettingsError: CUDA or fp16 asked for without a GPU, bf16 on a GPU without it
            (:func:`check_precision`), a device/precision other than the one this process
            already uses, or an FSDP/DeepSpeed configuration.
    """
    global _ACCELERATOR
    from accelerate import Accelerator

    check_distributed_type()
    mixed_precision = check_precision(device, mixed_precision)
    resolved = check_device(device)
    key = (resolved, mixed_precision)
    if _ACCELERATOR is not None:
        if _ACCELERATOR[0] != key:
            raise SettingsError(
                f"this process already trains with device={_ACCELERATOR[0][0]}, "
                f"mixed_precision={_ACCELERATOR[0][1]}; Accelerate allows one device and "
                f"precision per process: run device={resolved}, "
                f"mixed_precision={mixed_precision} in a new process", key="mixed_precision")
        return _ACCELERATOR[1]
    from accelerate.utils import InitProcessGroupKwargs

    # Under torchrun a rank waits in a collective for the others; if one died without its
    # launcher noticing, the wait ends after this timeout instead of never (Accelerate's
    # own default is 10 min for NCCL, 30 min for gloo).
    timeout = datetime.timedelta(seconds=_dist_timeout())
    try:
        accelerator = Accelerator(cpu=resolved == "cpu", mixed_precision=mixed_precision,
                                  kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout)])
    except ValueError as e:  # the state was already made by someone else, differently
        raise SettingsError(f"Accelerate refused device={resolved}, "
                            f"mixed_precision={mixed_precision}: {e}") from None
    kind = getattr(accelerator.distributed_type, "name", str(accelerator.distributed_type))
    if kind in _UNSUPPORTED_TYPES:
        raise SettingsError(f"{_UNSUPPORTED_TYPES[kind]} is not supported yet: geosearch trains "
                          "data parallel (DDP); choose no FSDP/DeepSpeed in `accelerate config`",
                          key="distributed_type")
    warning = launch_shortfall(accelerator.num_processes)
    if warning:  # one process of a launch that asked for more: the only one, so the main
        print(warning, file=sys.stderr)
    if accelerator.num_processes > 1:
        # Leave the process group cleanly at exit: gloo ranks that exit with it alive can
        # abort (SIGABRT) when their peer has already closed its sockets.
        atexit.register(accelerator.state.destroy_process_group)
    _ACCELERATOR = (key, accelerator)
    return accelerator


def _dist_timeout() -> float:
    """Seconds a rank waits in a collective: ``GEOSEARCH_DIST_TIMEOUT``, default 1800."""
    text = os.environ.get(DIST_TIMEOUT_ENV, "").strip()
    try:
        value = float(text) if text else 1800.0
    except ValueError:
        value = -1.0
    if not value > 0:
        raise SettingsError(f"must be a positive number of seconds but got {text!r}",
                          source=DIST_TIMEOUT_ENV)
    return value


def launch_shortfall(world: int, environ: Mapping[str, str] | None = None,
                     launcher: Sequence[str] | None = None) -> str | None:
    """The warning line for an ``accelerate launch`` that asked for more processes than started.

    Without ``--multi_gpu`` (or a multi-GPU ``accelerate config``), ``accelerate launch``
    runs the script once, in one process, whatever ``--num_processes`` or the config's
    ``num_processes`` says, on CPUs too (``distributed_type: MULTI_CPU`` starts more only
    through ``mpirun``: ``--mpirun_hostfile``). That launcher (accelerate 1.x,
    ``prepare_simple_launcher_cmd_env``) exports ``ACCELERATE_USE_CPU``, and ``MASTER_ADDR``
    only when more than one process (or machine) was asked for, but not how many: the
    number is read from the launcher's command line (``--num_processes``, else its config
    file's ``num_processes``), the parent process's.

    Args:
        world: the processes this run has (``accelerator.num_processes``).
        environ: the environment (default ``os.environ``).
        launcher: the launcher's command line (default: the parent process's).

    Returns:
        One line naming both numbers and the launch that starts them, or None: no such
        launch, as many processes as asked for, or a number that cannot be read.
    """
    env = os.environ if environ is None else environ
    if world != 1 or "ACCELERATE_USE_CPU" not in env or "MASTER_ADDR" not in env:
        return None
    asked = _asked_processes(_parent_command() if launcher is None else launcher)
    if asked is None or asked <= world:
        return None
    return (f"warning: accelerate launch asked for {asked} processes, but this run has {world}: "
            f"without --multi_gpu it starts one, on CPUs too; start {asked} with "
            f"`accelerate launch --multi_gpu --num_processes {asked} ...` (on a machine without "
            f"GPUs: {asked} CPU processes) or `torchrun --nproc_per_node {asked} ...`")


def _parent_command() -> list[str]:
    """The parent process's command line (``accelerate launch ...``), or [] if unreadable
    (not Linux, the parent gone or not ours)."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _asked_processes(command: Sequence[str]) -> int | None:
    """The processes an ``accelerate launch`` command line asks for: its ``--num_processes``,
    else its config file's (``--config_file``, else Accelerate's default one, as the launcher
    reads them), else None."""
    for i, token in enumerate(command):
        if token == "launch" or token.endswith(("accelerate.commands.launch", "accelerate-launch")):
            arguments = list(command[i + 1:])
            break
    else:
        return None
    from accelerate.commands.config.config_args import default_config_file, load_config_from_file
    from accelerate.commands.launch import launch_command_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage, on a bad line
            args, _ = launch_command_parser().parse_known_args(arguments)
    except SystemExit:
        return None
    if args.num_processes is not None:
        return args.num_processes
    path = args.config_file or (default_config_file if not args.cpu and os.path.isfile(default_config_file)
                                else None)
    try:
        return int(load_config_from_file(path).num_processes) if path else None
    except Exception:  # noqa: BLE001 - unreadable: the launcher would have failed on it
        return None
