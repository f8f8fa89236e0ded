"""Every ``hf:MODEL_TYPE`` end to end at its default (shrunk) size: build, forward, probe, step.

For each model type (default: every decoder-only causal LM type of the installed
transformers, listed or not), within a per-type time limit: build it as ``--model
hf:TYPE`` does (random weights, the byte vocabulary), run one forward pass, record its
attention logits when the probes can capture them, bind ``attn=stiefel,mlp=dgram`` with
its default rules, and take one optimizer step. Prints one row per type (the stage it
reached and why it stopped) and the counts by stage and reason.

    python benchmarks/hf_families.py                      # every type
    python benchmarks/hf_families.py gptj gpt_neo mixtral  # some
    python benchmarks/hf_families.py --listed             # only what inspect --models lists
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass

import torch

from geosearch.assignment import Assignment
from geosearch.build import build_optimizer
from geosearch.models.lm import lm_loss
from geosearch.models.zoo import build_model
from geosearch.proxy.probes import attention_stats

ASSIGN = "attn=stiefel,mlp=dgram"
STAGES = ("build", "forward", "probe", "bind", "step", "ok")


@dataclass
class FamilyResult:
    """What happened to one model type: the stage it stopped at (``ok`` when it passed
    them all), why, whether its attention was probed, and how long it took."""

    model_type: str
    stage: str
    reason: str
    probed: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.stage == "ok"


class _Timeout(BaseException):  # not an Exception: the model's own error handling lets it through
    pass


@contextlib.contextmanager
def _limit(seconds: float):
    """Raise :class:`_Timeout` after ``seconds`` (main thread, POSIX); no limit elsewhere."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise _Timeout(f"over {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:160]}"


def check_family(model_type: str, *, timeout: float = 60.0, seed: int = 0) -> FamilyResult:
    """Run ``hf:<model_type>`` through build, forward, probe, bind and one step."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    stage, probed = "build", False
    try:
        with _limit(timeout):
            built = build_model(f"hf:{model_type}", vocab_size=256, for_data=False)
            stage = "forward"
            model = built.model
            T = min(built.block_size, 32)
            x = torch.randint(0, 256, (2, T + 1))
            loss = lm_loss(model, x[:, :-1], x[:, 1:])
            if not torch.isfinite(loss):
                raise ValueError(f"loss {loss.item()}")
            stage = "probe"
            if built.qk_source is not None:
                stats = attention_stats(model, x[:, :-1], built.qk_source)
                probed = bool(stats["max_logit_per_layer"])
            stage = "bind"
            if built.rules is None:
                raise ValueError("no rules")
            opt = build_optimizer(model, Assignment.parse(ASSIGN, rules=built.rules), verbose=False)
            stage = "step"
            model.zero_grad(set_to_none=True)
            lm_loss(model, x[:, :-1], x[:, 1:]).backward()
            opt.step()
            after = lm_loss(model, x[:, :-1], x[:, 1:])
            if not torch.isfinite(after):
                raise ValueError(f"loss after a step {after.item()}")
            stage = "ok"
            reason = ""
    except _Timeout as e:
        reason = f"timeout: {e}"
    except Exception as e:  # noqa: BLE001 - any failure of a family is its row
        reason = _reason(e)
    return FamilyResult(model_type, stage, reason, probed, time.perf_counter() - start)


def reason_class(result: FamilyResult) -> str:
    """A short class of a failure, for the counts: the stage and the reason's first words."""
    if result.ok:
        return "ok (probed)" if result.probed else "ok (no attention probes)"
    head = result.reason.split(":")[0]
    if "strides" in result.reason:
        head = "stride not a multiple of 16 bytes"
    elif "leaves" in result.reason or "matches no rule" in result.reason or "no rule" in result.reason:
        head = "hidden weight without a geometry"
    return f"{result.stage}: {head}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("types", nargs="*", help="model types (default: all)")
    parser.add_argument("--listed", action="store_true", help="only the types inspect --models lists")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per type (default 60)")
    args = parser.parse_args(argv)
    logging.getLogger("geosearch").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.types:
        types = args.types
    elif args.listed:
        from geosearch.models.hf_configs import listed_types

        types = listed_types()
    else:
        from geosearch.models.hf_configs import causal_lm_types

        types = causal_lm_types()
    results = []
    for t in types:
        r = check_family(t, timeout=args.timeout)
        results.append(r)
        print(f"{t:<28} {r.stage:<8} {'probed' if r.probed else '-':<7} {r.seconds:6.1f}s  {r.reason}",
              flush=True)
    counts = Counter(reason_class(r) for r in results)
    ok = sum(r.ok for r in results)
    print(f"\n{ok} of {len(results)} types work end to end "
          f"({sum(r.ok and r.probed for r in results)} with attention probes)")
    for cls, n in counts.most_common():
        print(f"{n:4d}  {cls}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
