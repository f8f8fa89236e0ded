"""``geosearch geometries``: the geometries a module type can take, one line each."""

from __future__ import annotations

import argparse


def add(p: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> int:
    from geosearch.manifolds import get_manifold, manifold_names

    for name in manifold_names():
        doc = (get_manifold(name).__class__.__doc__ or "").strip().splitlines()
        print(f"{name:14s} {doc[0] if doc else ''}")
    print(f"{'adamw':14s} not a manifold: the weights are trained with AdamW")
    return 0
