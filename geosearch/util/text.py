"""Plain-text tables for the terminal: left-aligned text columns, right-aligned numbers."""

from __future__ import annotations

import textwrap
from collections.abc import Container, Sequence

__all__ = ["WIDTH", "text_table", "wrap"]

WIDTH = 100
"""The widest line the commands print: the search's header and the lines after its trials."""


def wrap(line: str, width: int = WIDTH, indent: str = "    ") -> list[str]:
    """``line`` broken at spaces into lines of at most ``width`` columns, the later ones
    indented by ``indent`` (a word longer than a line stays whole, on its own line).

    Example:
        >>> wrap("  target: 2000 steps at spectral_lr 0.02", width=24)
        ['  target: 2000 steps at', '    spectral_lr 0.02']
    """
    return textwrap.wrap(line, width, subsequent_indent=indent, break_long_words=False,
                         break_on_hyphens=False) or [line]


def text_table(cells: Sequence[Sequence[str]], numbers: Container[int] = (), indent: str = "  ") -> list[str]:
    """Lines of a table: the columns whose index is in ``numbers`` right-aligned, the rest left.

    Args:
        cells: rows of strings, the header first; every row as long as the header.
        numbers: indices of the columns holding numbers.
        indent: put before every line.

    Example:
        >>> print("\\n".join(text_table([("name", "n"), ("attn", "12"), ("mlp_in", "3")], numbers={1})))
          name     n
          attn    12
          mlp_in   3
    """
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return [indent + "  ".join(c.rjust(w) if i in numbers else c.ljust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in cells]
