"""Weight-space geometries: one file per set, a registry, and ``msign``.

Nothing here imports the rest of geosearch (callers turn :class:`UnknownManifoldError`
into their own user-facing error). Every geometry works on the tall orientation (wide
weights are transposed in and out) and on batched ``(..., m, n)`` tensors.

Example:
    >>> import torch
    >>> from geosearch.manifolds import get_manifold, manifold_names
    >>> manifold_names()
    ['dgram', 'euclidean', 'oblique', 'spectral_ball', 'sphere', 'stiefel']
    >>> W = get_manifold("stiefel").project(torch.randn(64, 16))
    >>> get_manifold("stiefel").check(W, atol=1e-4)[0]
    True
"""

from __future__ import annotations

from geosearch.manifolds.base import Manifold
from geosearch.manifolds.dgram import DGram
from geosearch.manifolds.euclidean import Euclidean
from geosearch.manifolds.msign import msign, polar
from geosearch.manifolds.oblique import Oblique
from geosearch.manifolds.spectral_ball import SpectralBall
from geosearch.manifolds.sphere import Sphere
from geosearch.manifolds.stiefel import Stiefel

__all__ = [
    "ADAMW",
    "Manifold",
    "UnknownManifoldError",
    "geometry_names",
    "get_manifold",
    "manifold_names",
    "msign",
    "polar",
    "register_manifold",
]

# Not a manifold: the geometry name that means "train these weights with AdamW". Every layer
# above the optimizer reads it from geosearch.optim.settings, which loads no torch (this
# package imports nothing else, so it cannot import that one); a test pins the two equal.
ADAMW = "adamw"


class UnknownManifoldError(KeyError, ValueError):
    """A geometry name that is not registered; the message lists the known ones."""

    def __init__(self, name: object, known: list[str]) -> None:
        self.name, self.known = name, list(known)
        super().__init__(f"unknown geometry {name!r}; known geometries: {', '.join(self.known)}")

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


_REGISTRY: dict[str, type[Manifold]] = {}
_INSTANCES: dict[str, Manifold] = {}


def register_manifold(cls: type[Manifold]) -> type[Manifold]:
    """Add a :class:`Manifold` subclass under ``cls.name`` (usable as a decorator).

    Raises:
        ValueError: the name is empty, is ``"adamw"``, or is already registered; or the
            class leaves an abstract method undefined.
    """
    name = getattr(cls, "name", "")
    if not name or name == ADAMW:
        raise ValueError(f"a manifold needs a name other than {ADAMW!r}, got {name!r}")
    if name in _REGISTRY:
        raise ValueError(f"geometry {name!r} is already registered (by {_REGISTRY[name].__name__})")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise ValueError(f"geometry {name!r} ({cls.__name__}) does not define {', '.join(missing)}")
    _REGISTRY[name] = cls
    return cls


def get_manifold(name: str) -> Manifold:
    """The (stateless, shared) instance of the geometry registered as ``name``.

    Raises:
        UnknownManifoldError: ``name`` is not registered; the message lists the known names.
    """
    if name not in _REGISTRY:
        raise UnknownManifoldError(name, manifold_names())
    if name not in _INSTANCES:
        _INSTANCES[name] = _REGISTRY[name]()
    return _INSTANCES[name]


def manifold_names() -> list[str]:
    """Registered geometry names, sorted."""
    return sorted(_REGISTRY)


def geometry_names() -> list[str]:
    """Every name a module type may be assigned: the manifolds plus ``"adamw"``.

    Read from the registry at each call, so geometries registered later are included.
    """
    return manifold_names() + [ADAMW]


for _cls in (Euclidean, Stiefel, DGram, Oblique, Sphere, SpectralBall):
    register_manifold(_cls)
