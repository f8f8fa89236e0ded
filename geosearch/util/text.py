"""Plain-text tables for the terminal: left-aligned text columns, right-aligned numbers."""

from __future__ import annotations

from collections.abc import Container, Sequence

__all__ = ["text_table"]


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
