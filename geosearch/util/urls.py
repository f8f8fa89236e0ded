"""A storage URL's secrets, kept out of everything geosearch says, writes or starts.

A storage URL may carry a password (``postgresql://me:pw@db/x``) or a secret query
parameter (``?password=...``). :func:`mask_url` masks them for messages, files and
``config.yaml`` (:func:`mask_argv` for a whole command line), :func:`redact` masks them in
a driver's error message, and :func:`hide_secrets` gives a ``--workers`` worker the masked
URL on its command line (which every user of the machine can read) and the full one in its
environment (:data:`STORAGE_ENV`), which :func:`storage_url` reads back. Torch-free; the
rules are in ``docs/design.md`` ("The study").
"""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["STORAGE_ENV", "hide_secrets", "mask_argv", "mask_url", "raw_at_in_password", "redact", "storage_url"]

STORAGE_ENV = "GEOSEARCH_STORAGE_URL"
"""The full storage URL, secrets included, for a process whose ``--storage`` is its masked
form (:func:`mask_url`): ``--workers`` hands it so to its workers, not on their command line."""

_USERINFO = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^:/]*:)(?P<password>.*)@")
"""A URL's ``user:password@`` read conservatively: the password runs to the last ``@``
(SQLAlchemy's own parse ends it at the first)."""
_SECRET_KEY = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)
"""A query parameter whose value is masked: ``password`` (libpq), ``passwd`` (MySQL), ..."""
_SECRET_PARAM = re.compile(r"(?P<key>(?<=[?&;])[^=&;?#]*?(?:pass|pwd|secret|token)[^=&;?#]*=)"
                           r"(?P<value>[^&;#]*)", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][\w+.-]*://")
_URL_IN_TEXT = re.compile(r"[A-Za-z][\w+.-]*://[^\s'\"`<>()\[\]]*(?<![.,:;])")
_MASK = "***"


def _parsed(url: str) -> Any:
    """SQLAlchemy's ``URL`` of ``url``, or ``None`` when it cannot parse it."""
    try:
        from sqlalchemy.engine import (
            make_url,  # comes with Optuna; imported when needed
        )

        return make_url(url)
    except Exception:  # noqa: BLE001 - ArgumentError, ValueError (a bad port), ImportError
        return None


def raw_at_in_password(url: str) -> bool:
    """Whether an ``@`` follows the one SQLAlchemy ends the URL's password at: a password
    holding a raw ``@``, which SQLAlchemy would take as part of the host or database."""
    m = _USERINFO.match(url)
    return m is not None and "@" in m.group("password")


def _mask_conservatively(url: str) -> str:
    """``url`` with everything that could be a password masked, read by :data:`_USERINFO`
    and :data:`_SECRET_PARAM` (for a URL SQLAlchemy cannot parse, or an ambiguous one)."""
    m = _USERINFO.match(url)
    if m is not None:
        url = m.group("head") + _MASK + "@" + url[m.end():]
    return _SECRET_PARAM.sub(lambda p: p.group("key") + _MASK, url)


def mask_url(url: str) -> str:
    """A storage URL with its secrets masked, fit to print or to pass on a command line:
    ``postgresql://me:***@db/x``, ``postgresql://me@db/x?password=***``.

    The password of the user info is masked by SQLAlchemy's own rendering
    (``render_as_string(hide_password=True)``), the value of every query parameter whose
    name holds ``pass``, ``pwd``, ``secret`` or ``token`` (any case) too. A URL without
    secrets, and anything that is not a URL (a journal file path), comes back unchanged.
    A URL SQLAlchemy cannot parse, or one where an ``@`` follows the password (a raw ``@``
    in it, which SQLAlchemy would take for the host's), is masked conservatively: from the
    user name's ``:`` to the last ``@``, and every such parameter.
    """
    if not _SCHEME.match(url):
        return url
    u = _parsed(url)
    if u is None or raw_at_in_password(url):
        return _mask_conservatively(url)
    secret = [k for k in u.query if _SECRET_KEY.search(k)]
    if u.password in (None, _MASK) and all(v == _MASK for k in secret for v in _as_list(u.query[k])):
        return url  # as given (or masked already): a rendering would quote it anew (a:b -> a%3Ab)
    from urllib.parse import quote_plus

    query = "&".join(f"{quote_plus(k)}={_MASK if k in secret else quote_plus(v)}"
                     for k in sorted(u.query) for v in _as_list(u.query[k]))
    return u.set(query={}).render_as_string(hide_password=True) + ("?" + query if query else "")


def _as_list(value: str | tuple[str, ...] | list[str]) -> list[str]:
    """A query parameter's values (SQLAlchemy keeps a repeated one as a tuple)."""
    return [value] if isinstance(value, str) else list(value)


def _secrets(url: str) -> set[str]:
    """Every string of ``url`` that :func:`mask_url` hides, as written and as decoded."""
    from urllib.parse import unquote, unquote_plus

    found: set[str] = set()
    if not _SCHEME.match(url):
        return found
    u, m = _parsed(url), _USERINFO.match(url)
    if m is not None and (u is None or u.password is not None or raw_at_in_password(url)):
        found |= {m.group("password"), unquote(m.group("password"))}
    if u is not None and u.password is not None:
        found.add(str(u.password))
    for p in _SECRET_PARAM.finditer(url):
        found |= {p.group("value"), unquote_plus(p.group("value"))}
    for k in u.query if u is not None else ():
        if _SECRET_KEY.search(k):
            found.update(_as_list(u.query[k]))
    return {s for s in found if s and s != _MASK}


def redact(text: str, storage: str | None) -> str:
    """``text`` (a driver's or a storage's error message) with every URL in it masked and
    each secret of the storage URL ``storage`` (or of the full URL a worker was given for
    it, :func:`storage_url`) replaced by ``***`` wherever it shows."""
    text = _URL_IN_TEXT.sub(lambda m: mask_url(m.group()), text)
    if storage is None:
        return text
    for secret in sorted(_secrets(storage) | _secrets(storage_url(storage)), key=len, reverse=True):
        text = text.replace(secret, _MASK)
    return text


def mask_argv(argv: list[str]) -> list[str]:
    """A command line with the URL of each argument masked (``--storage URL``,
    ``--storage=URL``): what a trial's ``config.yaml`` records."""
    out = []
    for a in argv:
        m = re.search(r"[A-Za-z][\w+.-]*://", a)
        out.append(a if m is None else a[:m.start()] + mask_url(a[m.start():]))
    return out


def hide_secrets(storage: str) -> tuple[str, dict[str, str]]:
    """What a worker process's command line carries for ``storage`` (its masked form), and
    the environment that hands it the full URL (:data:`STORAGE_ENV`; empty without secrets).

    Every user of the machine can read a command line (``ps``); a process's environment
    only its own user.
    """
    shown = mask_url(storage)
    return shown, ({} if shown == storage else {STORAGE_ENV: storage})


def storage_url(storage: str) -> str:
    """The URL a process opens for ``--storage``: the full URL of :data:`STORAGE_ENV` when
    ``storage`` is its masked form (a ``--workers`` worker), else ``storage`` itself."""
    full = os.environ.get(STORAGE_ENV)
    if full and full != storage and mask_url(full) == storage:
        return full
    return storage
