"""User-facing errors (geosearch/util/errors.py): one line, naming where, within the line's budget."""

from __future__ import annotations

from geosearch.util.errors import MAX_MESSAGE, ConfigError


def test_a_long_list_of_allowed_values_is_cut_to_the_budget_saying_how_many_are_left_out():
    names = [f"model_type_{i:03d}" for i in range(300)]
    msg = str(ConfigError("unknown model type 'x'", source="space.yaml", key="proxy.model", allowed=names))
    # Rule: a message keeps to MAX_MESSAGE, so that `geosearch <command>: error: <message>`
    # stays within 400 characters; the cut says how many names it left out.
    assert len(msg) <= MAX_MESSAGE and "\n" not in msg
    head, _, listed = msg.partition("; expected one of: ")
    assert head == "space.yaml: proxy.model: unknown model type 'x'"
    kept, _, more = listed.rpartition(", ... and ")
    assert more.endswith(" more") and len(kept.split(", ")) + int(more.split()[0]) == 300
    assert kept.split(", ") == names[: len(kept.split(", "))]
    # Rule: a short list is left whole, and a long message still names one value.
    assert str(ConfigError("bad", allowed=["a", "b"])) == "bad; expected one of: a, b"
    long = str(ConfigError("x" * 400, allowed=names))
    assert long.endswith("; expected one of: model_type_000, ... and 299 more")
