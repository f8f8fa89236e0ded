"""User-facing errors.

Everything a user can get wrong (a file, a key, a value, a name) raises a
:class:`GeosearchError` whose message is one line naming where the problem is and what
was expected. The CLI prints that line and exits non-zero without a traceback;
library callers get an ordinary exception.
"""

from __future__ import annotations

from collections.abc import Iterable


MAX_MESSAGE = 360
"""The length a message keeps to, so that a command's line (``geosearch <command>: error: ``
and the message) stays within 400 characters: a list of allowed values is cut to fit, saying
how many it leaves out (a message points to where the whole list is, e.g. ``geosearch
inspect --models``, when it may be long)."""


class GeosearchError(Exception):
    """An error caused by user input; its message is meant to be shown as is."""


class ConfigError(GeosearchError, ValueError):
    """A bad value in a YAML file, a CLI flag or an API argument.

    Args:
        problem: what is wrong, e.g. ``"unknown geometry 'stiefle'"``.
        source: the file (or ``"--assign"``, ``"build_optimizer"``...) the value came from.
        key: the key path inside it, e.g. ``"geometry.attn_qkv"``.
        allowed: the allowed values, listed in the message.

    Example:
        >>> str(ConfigError("unknown geometry 'x'", source="a.yaml", key="geometry.mlp_in",
        ...                 allowed=["dgram", "stiefel"]))
        "a.yaml: geometry.mlp_in: unknown geometry 'x'; expected one of: dgram, stiefel"
    """

    def __init__(
        self,
        problem: str,
        *,
        source: str | None = None,
        key: str | None = None,
        allowed: Iterable[object] | None = None,
    ) -> None:
        self.problem, self.source, self.key = problem, source, key
        self.allowed = list(allowed) if allowed is not None else None
        super().__init__(self._format())

    def _format(self) -> str:
        where = ": ".join(str(x) for x in (self.source, self.key) if x)
        msg = f"{where}: {self.problem}" if where else self.problem
        if self.allowed is not None:
            head = "; expected one of: "
            msg += head + fit_list(self.allowed, MAX_MESSAGE - len(msg) - len(head))
        return msg


class SettingsError(ConfigError):
    """A :class:`ConfigError` of the settings every run of a command shares, whatever it
    trains: the device, the mixed precision, how the batch splits over processes and
    micro-batches, the trackers, the data, the model. A run refuses them before it trains;
    a search stops on one instead of failing each of its trials
    (:func:`geosearch.search.study.failures.failure_kind` calls it ``settings``).

    Example:
        >>> str(SettingsError("fp16 needs a CUDA device", source="c.yaml", key="mixed_precision"))
        'c.yaml: mixed_precision: fp16 needs a CUDA device'
    """

    @classmethod
    def of(cls, error: ConfigError) -> SettingsError:
        """``error`` said again as a settings error (the same line)."""
        if isinstance(error, SettingsError):
            return error
        return cls(error.problem, source=error.source, key=error.key, allowed=error.allowed)


def fit_list(items: Iterable[object], room: int) -> str:
    """``items`` joined by commas, cut to ``room`` characters (one item at least), the cut
    said as ``, ... and N more``.

    Example:
        >>> fit_list(range(100), 30)
        '0, 1, 2, 3, 4, ... and 95 more'
    """
    names = [str(a) for a in items]
    text = ", ".join(names)
    if len(text) <= room:
        return text
    kept = names[:1]
    for name in names[1:]:
        if len(", ".join([*kept, name])) + len(f", ... and {len(names) - len(kept) - 1} more") > room:
            break
        kept.append(name)
    return ", ".join(kept) + f", ... and {len(names) - len(kept)} more"


def unknown_name(kind: str, name: object, known: Iterable[object], **where) -> ConfigError:
    """The error for a name missing from a registry, listing the known names."""
    return ConfigError(f"unknown {kind} {name!r}", allowed=sorted(map(str, known)), **where)
