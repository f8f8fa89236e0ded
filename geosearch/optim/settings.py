"""The optimizer's vocabulary: every setting once, with its kind, default, allowed values and doc.

One table, :data:`SETTINGS`, that every layer reads: :class:`~geosearch.optim.ManifoldMuon`
takes its group keys and defaults from it (:func:`group_defaults`), ``build_optimizer``
its global settings (:func:`defaults`), an assignment its per-type options
(:func:`option_keys`), and a config, a search-space schema or a CLI flag can take names,
defaults and help text from it (:func:`names`, :func:`defaults`, :func:`help`). Values are
checked and normalised in one place, :func:`check`. Adding a solver option means adding a
row here (``solver_arg=True`` passes it on to the solver) and taking the keyword in
:func:`~geosearch.optim.solvers.manifold_muon_update`. This module imports no torch.

Scopes say where a setting goes:

* ``"muon"``: a global setting written into every manifold-Muon group, and a per-type
  option of the types with a manifold geometry;
* ``"adamw"``: the same for AdamW groups and the types assigned ``"adamw"``;
* ``"euclidean"``: a key of manifold-Muon groups that only ``euclidean`` blocks may set
  (weight decay: constrained weights are not decayed); with ``"muon"`` too, a global
  setting written into every manifold-Muon group that only ``euclidean`` blocks read, and
  a per-type option of ``euclidean`` types only (Muon's shape scale);
* ``"layout"``: a manifold-Muon group key set from the name rules (fused blocks) or the
  model (heads), not by users;
* ``"type"``: a per-type option of manifold (and ``euclidean``) types only, neither a global
  setting nor a group key: the plan turns it into layout keys (``per_head`` -> ``heads``).

A setting's group key is its name, but for ``spectral_lr``, which is the ``lr`` of the
manifold-Muon groups (so the per-type option ``lr`` of a manifold type is its spectral
step size).

Example:
    >>> defaults()["spectral_lr"], option_keys("adamw")
    (0.02, ('lr', 'betas', 'eps', 'weight_decay'))
    >>> check("lr", "6e-4", source="a.yaml", key="settings.lr")
    0.0006
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from geosearch.util.checks import Range, parse_decimal
from geosearch.util.errors import ConfigError

__all__ = [
    "ADAMW", "EUCLIDEAN", "KINDS", "LAYOUT", "MUON", "RANGES", "RANGES_OF", "SCOPES", "SETTINGS",
    "TYPE", "Setting",
    "check", "defaults", "group_defaults", "group_setting", "group_values", "help", "kinds", "names",
    "option_keys", "option_setting", "solver_keys", "validate",
]

MUON, ADAMW, EUCLIDEAN, LAYOUT, TYPE = "muon", "adamw", "euclidean", "layout", "type"
SCOPES = (MUON, ADAMW, EUCLIDEAN, LAYOUT, TYPE)
"""The scopes of the module docstring. ``"adamw"`` and ``"euclidean"`` are also the
geometry names of the same meaning: :data:`ADAMW` is the torch-free home of
``geosearch.manifolds.ADAMW``, which every layer above the optimizer reads from here."""

RANGES: dict[str, Range] = {
    "positive": Range(0, open_low=True),
    "nonnegative": Range(0),
    "unit": Range(0, 1, open_high=True),
    "count": Range(1, 10_000, whole=True),
}
"""The numeric kinds -> their :class:`~geosearch.util.checks.Range` (the one rule for numbers: NaN,
±inf and bools are in none; a count has an upper bound, so that ``ns_steps: 1e12`` written as
an integer is refused rather than run out of memory)."""

KINDS = {
    "positive": RANGES["positive"].text,
    "nonnegative": RANGES["nonnegative"].text,
    "unit": RANGES["unit"].text,
    "bool": "true or false",
    "count": RANGES["count"].text,
    "choice": "one of the allowed values",
    "betas": "two numbers in [0, 1), e.g. [0.9, 0.95]",
}
"""Kind of value -> what a valid value looks like, in words."""

_SAME = object()  # group_default: same as default


@dataclass(frozen=True)
class Setting:
    """One optimizer setting.

    Attributes:
        name: the name users write (``build_optimizer`` keyword, YAML key).
        kind: a key of :data:`KINDS`.
        default: the default of the global setting.
        doc: one line saying what it does.
        scope: where it goes, a tuple of :data:`SCOPES` (module docstring).
        choices: the allowed values of a ``"choice"`` setting.
        key: the param-group key it sets when that is not ``name`` (``spectral_lr`` -> ``lr``).
        group_default: what a param group without the key gets, when not ``default``
            (weight decay: 0.1 from ``build_optimizer``, 0 in a bare group).
        group_kind: the kind a bare param group's value is checked as, when looser than
            ``kind`` (a group may hold ``lr`` 0, as torch's optimizers allow).
        what: how messages describe a valid value, when not the kind's words.
        solver_arg: the optimizer passes the group's value on to the direction solver
            (:func:`geosearch.optim.solvers.manifold_muon_update`) as a keyword argument.
    """

    name: str
    kind: str
    default: Any
    doc: str
    scope: tuple[str, ...]
    choices: tuple[Any, ...] = ()
    key: str = ""
    group_default: Any = _SAME
    group_kind: str = ""
    what: str = ""
    solver_arg: bool = False

    @property
    def group_key(self) -> str:
        """The param-group key this setting sets."""
        return self.key or self.name

    @property
    def is_global(self) -> bool:
        """Whether it is a global setting (``build_optimizer`` keyword, ``Assignment.settings``)."""
        return MUON in self.scope or ADAMW in self.scope

    def default_in_group(self) -> Any:
        """What a param group that lacks the key gets."""
        return self.default if self.group_default is _SAME else self.group_default


_TABLE = (
    Setting("lr", "positive", 6e-4, "AdamW step size (embeddings, head, norms, biases, 'adamw' types)",
            (ADAMW,), group_kind="nonnegative"),
    Setting("spectral_lr", "positive", 0.02, "manifold-Muon spectral step size η (per-type option: 'lr')",
            (MUON,), key="lr", group_kind="nonnegative"),
    Setting("betas", "betas", (0.9, 0.95), "AdamW moment decay rates (β1, β2)", (ADAMW,)),
    Setting("eps", "positive", 1e-8, "AdamW denominator guard", (ADAMW,)),
    Setting("weight_decay", "nonnegative", 0.1,
            "decoupled weight decay of AdamW matrices; per-type option of 'euclidean' types too",
            (ADAMW, EUCLIDEAN), group_default=0.0),
    Setting("momentum", "unit", 0.95, "manifold-Muon momentum β", (MUON,)),
    Setting("nesterov", "bool", True, "Nesterov momentum for manifold Muon", (MUON,)),
    Setting("solver", "choice", "project", "manifold-Muon direction solver: one msign, or dual ascent",
            (MUON,), choices=("project", "dual"), what="a solver name", solver_arg=True),
    Setting("dual_steps", "count", 20, "most dual-ascent updates per step (solver 'dual')", (MUON,),
            solver_arg=True),
    Setting("dual_lr", "positive", 0.1, "dual-ascent step α, for the gradient scaled to unit RMS singular value",
            (MUON,), solver_arg=True),
    Setting("dual_tol", "nonnegative", 1e-3, "dual ascent stops once the tangent residual is below this",
            (MUON,), solver_arg=True),
    Setting("warm_start", "bool", False, "start dual ascent from the previous step's dual variable", (MUON,)),
    Setting("ns_steps", "count", 5, "Newton–Schulz iterations per msign", (MUON,), solver_arg=True),
    Setting("ns_coefficients", "choice", "polar_express",
            "msign's Newton–Schulz coefficients: Polar Express's per iteration, or Keller Jordan's "
            "fixed quintic (torch.optim.Muon's)", (MUON,), choices=("polar_express", "quintic"),
            what="a coefficient set", solver_arg=True),
    Setting("retraction", "choice", "auto",
            "retraction after a manifold step: auto (the fixed warm one where it was measured "
            "to hold the constraint, else adaptive), adaptive (checked per matrix), fixed "
            "(fixed iterations)",
            (MUON,), choices=("auto", "adaptive", "fixed"), what="a retraction", solver_arg=True),
    Setting("fixed_iterations", "bool", False,
            "no data-dependent control flow (for torch.compile): the dual loop runs all dual_steps "
            "and the retraction is the fixed one", (MUON,), solver_arg=True),
    Setting("muon_scale", "choice", "keller",
            "shape scale of unconstrained Muon's (euclidean) step: sqrt(max(1, fan_out/fan_in)) "
            "(Keller Jordan's, torch.optim.Muon's 'original'), or none (a spectral step of lr)",
            (MUON, EUCLIDEAN), choices=("keller", "none"), what="a shape scale"),
    Setting("split", "count", 1, "equal blocks a fused weight is cut into, each constrained on its own",
            (LAYOUT,)),
    Setting("split_dim", "choice", 0, "the weight dimension holding the outputs: 0 (out, in), 1 (in, out)",
            (LAYOUT,), choices=(0, 1), what="0 or 1"),
    Setting("heads", "count", 1, "equal row blocks (heads) each block is cut into, each "
            "constrained on its own; a tuple gives one count per block", (LAYOUT,)),
    Setting("per_head", "bool", False, "each head's rows of a Q, K or V projection are a matrix of "
            "their own on the manifold, stepped as one batch over heads", (TYPE,)),
)

SETTINGS: MappingProxyType[str, Setting] = MappingProxyType({s.name: s for s in _TABLE})
"""Setting name -> :class:`Setting`, in the order settings are listed everywhere."""
RANGES_OF: MappingProxyType[str, Range] = MappingProxyType(
    {s.name: RANGES[s.group_kind or s.kind] for s in _TABLE if (s.group_kind or s.kind) in RANGES})
"""Setting name -> the range a value of it may take (in a param group, where that is looser),
for the settings that are one number."""


# --------------------------------------------------------------------------- views
def names(scope: str | None = None) -> tuple[str, ...]:
    """Setting names, in table order.

    Args:
        scope: ``None`` for all; ``"global"`` for the global settings (``build_optimizer``
            keywords, ``Assignment.settings``); or one of :data:`SCOPES`.
    """
    if scope is None:
        return tuple(s.name for s in _TABLE)
    if scope == "global":
        return tuple(s.name for s in _TABLE if s.is_global)
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; expected 'global' or one of {', '.join(SCOPES)}")
    return tuple(s.name for s in _TABLE if scope in s.scope)


def defaults(scope: str | None = "global") -> dict[str, Any]:
    """Setting name -> default, for :func:`names` ``(scope)`` (a fresh dict)."""
    return {n: SETTINGS[n].default for n in names(scope)}


def solver_keys() -> tuple[str, ...]:
    """The manifold-Muon group keys the optimizer passes on to the direction solver."""
    return tuple(s.group_key for s in _TABLE if s.solver_arg)


def kinds() -> dict[str, str]:
    """Setting name -> kind, for every setting."""
    return {s.name: s.kind for s in _TABLE}


def _group_settings(group: str) -> list[Setting]:
    if group == MUON:
        return [s for s in _TABLE if {MUON, EUCLIDEAN, LAYOUT} & set(s.scope)]
    if group == ADAMW:
        return [s for s in _TABLE if ADAMW in s.scope]
    raise ValueError(f"unknown group kind {group!r}; expected {MUON!r} or {ADAMW!r}")


def group_defaults(group: str) -> dict[str, Any]:
    """Param-group key -> default of a ``"muon"`` (manifold) or ``"adamw"`` group."""
    return {s.group_key: s.default_in_group() for s in _group_settings(group)}


def group_values(group: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a ``"muon"`` or ``"adamw"`` param group takes from global setting values
    (``values``: name -> value for :func:`names` ``("global")``; ``spectral_lr`` becomes a
    manifold group's ``lr``)."""
    if group not in (MUON, ADAMW):
        raise ValueError(f"unknown group kind {group!r}; expected {MUON!r} or {ADAMW!r}")
    return {s.group_key: values[s.name] for s in _TABLE if group in s.scope}


def group_setting(group: str, key: str) -> Setting:
    """The setting behind param-group key ``key`` of a ``"muon"`` or ``"adamw"`` group."""
    for s in _group_settings(group):
        if s.group_key == key:
            return s
    raise KeyError(key)


def option_keys(geometry: str) -> tuple[str, ...]:
    """The per-type options a module type with this geometry accepts (param-group keys).

    ``lr`` is the AdamW step size of ``adamw`` types and the spectral step size of
    manifold types; weight decay applies to ``adamw`` and ``euclidean`` types only, the
    Muon shape scale (``muon_scale``) to ``euclidean`` types only.
    """
    if geometry == ADAMW:
        return tuple(s.group_key for s in _TABLE if ADAMW in s.scope)
    if geometry == EUCLIDEAN:
        return tuple(s.group_key for s in _TABLE if {MUON, EUCLIDEAN, TYPE} & set(s.scope))
    return tuple(s.group_key for s in _TABLE
                 if {MUON, TYPE} & set(s.scope) and EUCLIDEAN not in s.scope)


def option_setting(key: str, geometry: str) -> Setting:
    """The setting behind per-type option ``key`` of a type with ``geometry``.

    Raises:
        KeyError: the geometry takes no such option (see :func:`option_keys`).
    """
    if key not in option_keys(geometry):
        raise KeyError(key)
    if key in SETTINGS and TYPE in SETTINGS[key].scope:
        return SETTINGS[key]
    return group_setting(ADAMW if geometry == ADAMW else MUON, key)


def help(name: str) -> str:  # shadows the builtin here only: read it as settings.help(name)
    """One line for a CLI flag or a schema: doc, allowed values and default.

    Example:
        >>> help("solver")
        'manifold-Muon direction solver: one msign, or dual ascent (one of: project, dual; default: project)'
    """
    s = SETTINGS[name]
    allowed = f"one of: {', '.join(map(str, s.choices))}" if s.kind == "choice" else KINDS[s.kind]
    return f"{s.doc} ({allowed}; default: {_show(s.default)})"


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


# --------------------------------------------------------------------------- checks
def validate(name: str, value: Any, *, group: bool = False) -> tuple[Any, str | None]:
    """``(normalised value, None)`` when ``value`` is valid for setting ``name``, else
    ``(value, what a valid value looks like)``.

    Numbers come back as floats (``"6e-4"`` too: PyYAML reads exponents without a dot as
    strings), betas as a tuple. ``group=True`` checks a bare param group's value
    (``group_kind``). :func:`check` raises instead.
    """
    s = SETTINGS[name]
    kind = (s.group_kind or s.kind) if group else s.kind
    out = _normalise(kind, value, s.choices)
    if out is _BAD:
        return value, s.what or KINDS[kind]
    return out, None


_BAD = object()  # _normalise: not a valid value of the kind


def _normalise(kind: str, value: Any, choices: tuple[Any, ...]) -> Any:
    if kind == "bool":
        return value if isinstance(value, bool) else _BAD
    if kind == "choice":
        return value if any(value == c and type(value) is type(c) for c in choices) else _BAD
    if kind == "betas":
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 2:
            return _BAD
        pair = tuple(parse_decimal(b) for b in value)
        return pair if all(b is not None and 0 <= b < 1 for b in pair) else _BAD
    x, problem = RANGES[kind].check(value, read=parse_decimal)
    return _BAD if problem else x


def check(name: str, value: Any, *, source: str | None = None, key: str | None = None) -> Any:
    """Check one value of setting ``name`` and return it normalised (see :func:`validate`).

    Args:
        name: a name of :data:`SETTINGS`.
        value: the value as given (YAML, CLI, keyword).
        source: the file or API the value came from, for the message.
        key: the key path to name in the message (default: ``name``).

    Raises:
        ConfigError: "expected <what>, got <value>", with the allowed values of a choice.
    """
    out, want = validate(name, value)
    if want is None:
        return out
    s = SETTINGS[name]
    raise ConfigError(f"expected {want}, got {value!r}", source=source, key=key or name,
                      allowed=s.choices if s.kind == "choice" else None)
