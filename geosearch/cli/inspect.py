"""``geosearch inspect``: a model's parameters, their module types and candidate geometries
(:func:`geosearch.inspect.inspect_model`)."""

from __future__ import annotations

import argparse

from geosearch.cli._args import MODEL_ARG_HELP, MODEL_HELP, RULES_DEFAULT, key_values


def add(p: argparse.ArgumentParser) -> None:
    p.epilog = ("The model is built on the meta device (no memory, no initialisation), with the "
                "byte-level vocabulary (256) unless --model-arg vocab_size=N says otherwise.")
    p.add_argument("--model", metavar="SPEC", help=MODEL_HELP + " (default: the space's)")
    p.add_argument("--models", action="store_true",
                   help="list the model specs --model takes, every hf:MODEL_TYPE of the installed "
                        "transformers included, and stop")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE", help=MODEL_ARG_HELP)
    p.add_argument("--space", metavar="FILE|NAME", help="show each type's candidate geometries from this space")
    p.add_argument("--rules", metavar="NAME",
                   help=f"rule set (default: the space's, else the model's: {RULES_DEFAULT})")
    p.add_argument("--assign", metavar="ASSIGNMENT|FILE",
                   help="also show the plan of this assignment (e.g. attn=stiefel,mlp=dgram, or a "
                        "YAML file): each module type's geometry, blocks, step size and options")


def run(args: argparse.Namespace) -> int:
    from geosearch.inspect import inspect_model, model_lines

    if args.models:
        print("\n".join(model_lines()))
        return 0

    inspect_model(args.model, model_args=key_values(args.model_arg, "--model-arg"),
                  space=args.space, rules=args.rules, assign=args.assign)
    return 0
