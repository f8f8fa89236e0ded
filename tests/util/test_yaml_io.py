"""The one YAML loader: every failure is one line naming the file."""

from __future__ import annotations

import os

import pytest

from geosearch.util.errors import ConfigError
from geosearch.util.files import CONFIG_LIMIT
from geosearch.util.yaml_io import MAX_ALIASES, load_yaml, parse_value, parse_yaml


def test_reads_a_mapping(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("lr: 6e-4\nlist: [1, 2]\nanchor: &x {a: 1}\nalias: *x\n")
    data = load_yaml(path)
    # Rule: safe loading of plain data (PyYAML's 6e-4-as-string quirk is left to the checks).
    assert data == {"lr": "6e-4", "list": [1, 2], "anchor": {"a": 1}, "alias": {"a": 1}}


@pytest.mark.parametrize("make, words", [
    (lambda p: p, "file not found"),
    (lambda p: p.mkdir() or p, "is a directory, expected a YAML file"),
    (lambda p: os.mkfifo(p) or p, "is a named pipe (FIFO), expected a YAML file"),  # not opened: no hang
    (lambda p: p.write_bytes(b"a: \xff\xfe\n") and p, "is not UTF-8 text (byte 0xff at offset 3)"),
    (lambda p: p.write_text("a: 1\n" + "#" * CONFIG_LIMIT) and p,
     f"is 1.0 MB ({CONFIG_LIMIT + 5} bytes), more than the 1 MiB a YAML file may hold"),
    (lambda p: p.write_text("a: [1, 2\nb: 3\n") and p, "malformed YAML at line 2, column 2: expected ',' or ']'"),
    (lambda p: p.write_text("a:\n\tb: 1\n") and p, "malformed YAML at line 2, column 1"),
    (lambda p: p.write_text("# only a comment\n") and p, "empty file; expected a search space"),
], ids=["missing", "directory", "fifo", "not-utf8", "too-large", "unclosed", "tab", "empty"])
def test_failures_are_one_line_naming_the_file(tmp_path, make, words):
    path = make(tmp_path / "f.yaml")
    with pytest.raises(ConfigError) as e:
        load_yaml(path, what="a search space")
    # Rule: one line, starting with the file name, saying what went wrong.
    assert str(e.value).startswith(f"{path}: ") and words in str(e.value) and "\n" not in str(e.value)


def test_empty_file_with_a_default(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text("")
    assert load_yaml(path, default={}) == {}


def test_alias_bombs_are_refused_before_they_are_built():
    fine = "a: &a [x]\nb: [" + ", ".join(["*a"] * MAX_ALIASES) + "]\n"
    assert len(parse_yaml(fine)["b"]) == MAX_ALIASES
    # Each level multiplies the expanded size by 10: 10^12 leaves from a dozen lines.
    levels = ["l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 13)]
    with pytest.raises(ConfigError, match=rf"^bomb.yaml: malformed YAML at line \d+, column \d+: more than "
                                          rf"{MAX_ALIASES} aliases"):
        parse_yaml("\n".join(levels) + "\n", source="bomb.yaml")


def test_long_problems_are_cut():
    with pytest.raises(ConfigError) as e:
        parse_yaml("key: 'unterminated " + "x" * 5000, source="s")
    # Rule: the message stays one short line whatever the input.
    assert len(str(e.value)) < 400 and "\n" not in str(e.value)


def test_a_command_line_value_is_yaml_or_its_text_and_its_aliases_are_bounded():
    assert parse_value("3") == 3 and parse_value("[a, 1]") == ["a", 1] and parse_value("") is None
    assert parse_value("[unclosed") == "[unclosed"  # not YAML: the text itself
    bomb = "[&a [1,1,1,1,1,1,1,1,1,1], " + ", ".join(
        f"&{c} [" + ",".join([f"*{p}"] * 10) + "]" for p, c in zip("abcdef", "bcdefg")) + "]"
    with pytest.raises(ConfigError, match=r"^--set x: malformed YAML .*more than 100000 values") as e:
        parse_value(bomb, source="--set x")
    assert len(str(e.value)) < 200


def test_a_key_given_twice_is_refused_naming_the_key_and_both_lines(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("version: 1\nproxy: {steps: 4, batch_size: 2}\nrepeats: 2\nproxy: {steps: 8}\n")
    with pytest.raises(ConfigError) as e:
        load_yaml(path)
    # Rule: PyYAML would keep the second `proxy:` and drop batch_size silently; the loader
    # names the key, the line of each, and says to give it once.
    assert str(e.value) == (f"{path}: malformed YAML at line 4, column 1: key 'proxy' is given twice "
                            "(lines 2 and 4); give it once (the second would replace the first)")
    # nested, on one line; keys equal as values (1 and 1.0, yes and true) are the same key
    for text, key in [("p:\n  a: {x: 1, x: 2}\n", "'x'"), ("1: a\n1.0: b\n", "1.0"), ("yes: 1\ntrue: 2\n", "True")]:
        with pytest.raises(ConfigError, match=rf"key {key} is given twice"):
            parse_yaml(text, source="f")


def test_merge_keys_may_repeat_a_key_and_a_value_given_on_the_command_line_may_not():
    # Rule: `<<` merges are how YAML repeats keys on purpose; the explicit key wins, as in YAML.
    text = "base: &b {steps: 4, lr: 0.1}\nrun:\n  <<: *b\n  steps: 8\n"
    assert parse_yaml(text)["run"] == {"steps": 8, "lr": 0.1}
    with pytest.raises(ConfigError, match=r"^--set proxy: malformed YAML at line 1, column 14: key 'a' "
                                          r"is given twice \(both on line 1\)"):
        parse_value("{a: 1, b: 2, a: 3}", source="--set proxy")
