"""The docs against the code: the numbers the code derives, the paragraph and README sizes,
the links between pages, and the sections the code cites.

A number such as the default target's Σ η (21.8) or the default search's cost (5,800
steps) is worked out by the library. README, docs/ and the shipped spaces' comments copy
it for the reader; this test recomputes every copy. Each claim names a phrase (a regular
expression over the text with its whitespace collapsed) and the numbers in it; the phrase
must be found as often as the claim says, and each number must equal the library's value
to the digits shown. A distinctive number written anywhere else fails too, so a new copy
gets a claim.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from geosearch.search.horizon.scale import model_logit_scale
from geosearch.search.space.plan import plan_study
from geosearch.search.space.spec import apply_overrides, load_space

REPO = Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------------------
# Every call into the library, in one table (repoint these when what they compute moves).
LIB: dict[str, Callable[..., Any]] = {
    "space": lambda name, *sets, **flags: apply_overrides(load_space(name), sets, **flags),
    "target": lambda space: plan_study(space).target,        # .sum_eta, .sum_eta2
    "rungs": lambda space: list(plan_study(space).rungs),    # [Rung(steps, spectral_lr, sum_eta)]
    "stability": lambda space: plan_study(space).stability,  # the stability rung, or None
    "plan_line": lambda space: plan_study(space).header_lines()[-1],  # the header's "trains:"
    "logit_scale": model_logit_scale,  # d/√d_head of a model spec
}
# ----------------------------------------------------------------------------------------


def _steps(line: str) -> dict[str, int]:
    """The step counts of a header's ``trains:`` line: its total, its worst cases."""
    total = re.search(r"= ([\d,]+) steps", line)
    found = {"total": int(total.group(1).replace(",", ""))} if total else {}
    for key, pattern in (("adaptive", r"up to ([\d,]+) with adaptive seeds"),
                         ("best_elsewhere", r"\+ up to ([\d,]+) where a best step is not"),
                         ("stability_fails", r"\+ up to ([\d,]+) where a larger step fails")):
        m = re.search(pattern, line)
        if m:
            found[key] = int(m.group(1).replace(",", ""))
    for name in ("adamw", "muon"):
        m = re.search(rf"{name} ([\d,]+)", line)
        if m:
            found[name] = int(m.group(1).replace(",", ""))
    return found


@cache
def derived() -> dict[str, float]:
    """The numbers the docs copy, as the library computes them today."""
    space, target, rungs, stability = LIB["space"], LIB["target"], LIB["rungs"], LIB["stability"]
    default = space("default")
    t, stab = target(default), stability(default)
    plan = _steps(LIB["plan_line"](default))
    grid = _steps(LIB["plan_line"](space("default", "hyperparams.step_grid=[0.5,1,2]")))
    full_grid = _steps(LIB["plan_line"](space("default", "hyperparams.step_grid=[0.5,1,2]",
                                              "hyperparams.step_halving=false")))
    paper = _steps(LIB["plan_line"](space("paper")))
    paper_shared = _steps(LIB["plan_line"](space("paper", "hyperparams.step_grid=null")))
    stab400 = stability(space("default", "ladder.stability_steps=400"))
    eta = default.proxy.spectral_lr

    def sum_eta_2000(model: str, lr: float) -> float:
        return target(space("default", f"proxy.spectral_lr={lr}", model=model)).sum_eta

    return {
        "target_sum_eta": t.sum_eta,
        "target_sum_eta2": t.sum_eta2,
        "proxy_sum_eta": rungs(default)[0].sum_eta,
        "stability_steps": stab.steps,
        "stability_factor": stab.spectral_lr / eta,
        "stability_lr": stab.spectral_lr,
        "stability_factor_400": stab400.spectral_lr / eta,
        "steps": plan["total"],
        "steps_adaptive": plan["adaptive"],
        "adaptive_extra": plan["adaptive"] - plan["total"],
        "baseline_steps": plan["adamw"] + plan["muon"],
        "assignment_steps": plan["total"] - plan["adamw"] - plan["muon"],
        "grid_steps": grid["total"],
        "grid_steps_worst": grid["total"] + grid["best_elsewhere"],
        "grid_stability_worst": grid["total"] + grid["best_elsewhere"] + grid["stability_fails"],
        "grid_adamw": grid["adamw"],
        "grid_muon": grid["muon"],
        "full_grid_steps": full_grid["total"],
        "paper_steps": paper["total"],
        "paper_steps_worst": paper["total"] + paper["best_elsewhere"],
        "paper_shared_steps": paper_shared["total"],
        "roles_steps": _steps(LIB["plan_line"](space("roles")))["total"],
        "threshold_mini": 10 * LIB["logit_scale"]("mini"),
        "scale_tiny": LIB["logit_scale"]("tiny"),
        "scale_mini": LIB["logit_scale"]("mini"),
        "scale_small": LIB["logit_scale"]("small"),
        "scale_gpt2": LIB["logit_scale"]("gpt2"),
        "sum_eta_small_0.05": sum_eta_2000("small", 0.05),
        "sum_eta_tiny_0.1": sum_eta_2000("tiny", 0.1),
        "sum_eta_tiny_0.02": sum_eta_2000("tiny", 0.02),
    }


N = r"(\d[\d,]*(?:\.\d+)?)"  # a number as the docs write it: 5,800, 21.8, 3.1
# (file, phrase with one group per number, the numbers' names, how often the phrase occurs)
CLAIMS: list[tuple[str, str, tuple[str, ...], int]] = [
    ("README.md", rf"\(Σ η {N} of the target's {N}\)", ("proxy_sum_eta", "target_sum_eta"), 1),
    ("README.md", rf"{N} steps at a larger step, {N}× the proxy's",
     ("stability_steps", "stability_factor"), 1),
    ("README.md", rf"In all, {N} steps of `mini`, at most {N} with adaptive seeds",
     ("steps", "steps_adaptive"), 1),
    # the default search's output as README shows it: its header and its order line
    ("README.md", rf"model mini: Σ η {N} \(the proxy's {N}\)", ("target_sum_eta", "proxy_sum_eta"), 1),
    ("README.md", rf"= {N} steps; up to {N} with adaptive seeds", ("steps", "steps_adaptive"), 1),
    ("README.md", rf"order at your target \(Σ η {N}\): not measured \(ranked at Σ η {N};",
     ("target_sum_eta", "proxy_sum_eta"), 1),
    ("search_spaces/default.yaml", rf"Σ η {N}, Σ η² {N} on the proxy's schedule",
     ("target_sum_eta", "target_sum_eta2"), 1),
    ("docs/spaces.md", rf"trains {N} steps at a larger step, {N}x the proxy's",
     ("stability_steps", "stability_factor"), 1),
    ("docs/spaces.md", rf"= {N} steps\. The baselines add {N}: .{{0,60}}That makes {N}\. "
     rf"Adaptive seeds add at most 4 x 400 = {N}\.",
     ("assignment_steps", "baseline_steps", "steps", "adaptive_extra"), 1),
    ("docs/spaces.md",
     rf"`--set baselines=\[\]` cuts {N} steps and `--set max_repeats=2` up to {N}\.",
     ("baseline_steps", "adaptive_extra"), 1),
    ("docs/spaces.md", rf"trains {N}–{N} steps against {N}\.",
     ("grid_steps", "grid_steps_worst", "steps"), 1),
    ("docs/spaces.md", rf"trains every seed everywhere: {N}\.", ("full_grid_steps",), 1),
    ("docs/spaces.md", rf"\({N} steps instead of {N}-{N}\)",
     ("paper_shared_steps", "paper_steps", "paper_steps_worst"), 1),
    ("docs/spaces.md", rf"plus the baselines, = {N} steps, against `default\.yaml`'s {N}\.",
     ("roles_steps", "steps"), 1),
    ("docs/spaces.md", rf"max logit 10 × d/√d_head \({N} for `mini`: {N}\)",
     ("scale_mini", "threshold_mini"), 1),
    ("docs/design.md", rf"{N}–{N} steps by halving, 1\.67–2\.33× the {N} of the shared step",
     ("paper_steps", "paper_steps_worst", "paper_shared_steps"), 1),
    ("docs/design.md", rf"the baselines {N} \(AdamW\) and {N} \(Muon\): {N} steps, 1\.83× the "
     rf"shared-step search's {N}", ("grid_adamw", "grid_muon", "grid_steps", "steps"), 1),
    ("docs/design.md", rf"\(up to {N}, 2\.24×\)", ("grid_steps_worst",), 1),
    ("docs/design.md",
     rf"fails the stability rung 200 more \(up to {N}\)\. The full grid trains {N}",
     ("grid_stability_worst", "full_grid_steps"), 1),
    ("docs/design.md", rf"{N} steps run at {N} η and 200 at {N} η",
     ("stability_steps_400", "stability_factor_400", "stability_factor"), 1),
    ("docs/design.md",
     rf"about d/√d_head \({N} for `tiny`, {N} for `small`, {N} for GPT-2 small\)",
     ("scale_tiny", "scale_small", "scale_gpt2"), 1),
    ("docs/glossary.md", rf"the square root of the head size: {N} for `tiny`, {N} for `mini`",
     ("scale_tiny", "scale_mini"), 1),
    ("docs/glossary.md", rf"\"{N}×\" means {N} × η",
     ("stability_factor", "stability_factor"), 1),
    ("docs/benchmarks.md", rf"Σ η of the 2,000 steps \| {N} \| {N} \| {N} \| {N} \| {N} \|",
     ("target_sum_eta", "sum_eta_small_0.05", "sum_eta_tiny_0.02", "sum_eta_tiny_0.1",
      "sum_eta_small_0.05"), 1),
    ("docs/benchmarks.md", rf"At the same Σ η {N},", ("target_sum_eta",), 1),
    ("docs/benchmarks.md", rf"Σ η {N} of {N} leaves crossings ahead",
     ("proxy_sum_eta", "target_sum_eta"), 1),
    ("docs/benchmarks.md", rf"\(the plan line's {N}, 1\.83×", ("grid_steps",), 1),
    ("docs/benchmarks.md", rf"\({N} to {N} by the plan line",
     ("grid_steps", "grid_steps_worst"), 1),
    ("docs/benchmarks.md", rf"\({N} against {N} by the plan line",
     ("grid_steps", "full_grid_steps"), 1),
    ("docs/benchmarks.md", rf"{N} steps \(no adaptive seed", ("steps",), 1),
    ("docs/benchmarks.md", rf"\({N} \+ two adaptive seeds of 400\)", ("steps",), 1),
    ("docs/benchmarks.md", rf"\(5,800 to {N} steps of `small`", ("steps_adaptive",), 1),
    ("docs/benchmarks.md", rf"a third seed, adds {N} steps", ("adaptive_extra",), 1),
    ("docs/benchmarks.md", rf"Against the shared-step search \({N} steps on this space\)",
     ("steps",), 1),
    ("docs/benchmarks.md", rf"Scaled to the full default plan \({N} steps", ("steps",), 1),
    ("docs/benchmarks.md", rf"forward \+ backward 43\.1 ms × {N} / 2 cores", ("steps",), 1),
]
# Numbers distinctive enough that every occurrence must be inside a claim's phrase, and the
# measured figures that happen to read the same (file, the text around them).
SWEEP = ("21.8", "0.318", "5,800", "7,400", "10,600", "13,000", "17,400", "21,000")
NOT_DERIVED = [
    ("docs/benchmarks.md", r"at Σ η 6\.0, 15\.9 and 21\.8: a plateau"),  # the small run's probes
    ("docs/benchmarks.md", r"its floor 0\.318|stops at 0\.318|below 0\.318"),  # msign errors
]


def _doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
            *sorted((REPO / "search_spaces").glob("*.yaml"))]


def _flat(path: Path) -> str:
    """A file's text with its whitespace collapsed; of a YAML file, its comments only."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".yaml":
        text = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    return re.sub(r"\s+", " ", text)


def _agrees(written: str, value: float) -> bool:
    """``written`` is ``value`` to the digits it shows (5,800 exactly; 21.8 to ±0.05)."""
    plain = written.replace(",", "")
    decimals = len(plain.split(".")[1]) if "." in plain else 0
    return math.isclose(float(plain), value, abs_tol=0.5 * 10 ** -decimals + 1e-9)


def test_every_copied_number_is_the_one_the_code_computes():
    values = {**derived(), "stability_steps_400": 400}
    wrong = []
    for file, phrase, names, count in CLAIMS:
        text = _flat(REPO / file)
        matches = list(re.finditer(phrase, text))
        assert len(matches) == count, (
            f"{file}: the phrase {phrase!r} occurs {len(matches)} times, the claim says {count}: "
            "reword the claim with the text")
        for m in matches:
            for name, written in zip(names, m.groups(), strict=True):
                if not _agrees(written, values[name]):
                    wrong.append(f"{file}: {written} in {m.group(0)!r}, "
                                 f"but {name} is {values[name]:.4g}")
    assert wrong == [], "\n".join(wrong)


def test_no_derived_number_is_copied_where_no_claim_checks_it():
    loose = []
    for path in _doc_files():
        file = str(path.relative_to(REPO))
        text = _flat(path)
        phrases = [phrase for f, phrase, _, _ in CLAIMS if f == file]
        phrases += [phrase for f, phrase in NOT_DERIVED if f == file]
        covered = [m.span() for phrase in phrases for m in re.finditer(phrase, text)]
        for number in SWEEP:
            for m in re.finditer(rf"(?<![\d.,]){re.escape(number)}(?![\d,]|\.\d)", text):
                if not any(a <= m.start() and m.end() <= b for a, b in covered):
                    loose.append(f"{file}: {text[max(0, m.start() - 60):m.end() + 20]!r}")
    assert loose == [], ("copies of derived numbers no claim checks (add a claim):\n"
                         + "\n".join(loose))


def test_the_claims_compare_numbers_at_the_digits_shown():
    # Rule: a number agrees to the digits it shows, no further; a single edited digit fails.
    assert _agrees("21.8", 21.819) and not _agrees("21.9", 21.819) and not _agrees("23", 21.819)
    assert _agrees("5,800", 5800) and not _agrees("5,900", 5800) and _agrees("3.1", 3.1444)


# ---------------------------------------------------------------------------- prose sizes
MAX_WORDS, MAX_README_LINES = 150, 200


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a markdown text: blank-line separated, each list item its
    own; code blocks, tables, headings and HTML comments left out."""
    found: list[list[str]] = []
    current: list[str] = []
    fenced = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        skip = not stripped or stripped.startswith(("```", "|", "#", "<!--"))
        if fenced or skip:
            if current:
                found.append(current)
            current = []
            continue
        if re.match(r"([-*]|\d+\.) ", stripped) and current:
            found.append(current)
            current = []
        current.append(stripped)
    if current:
        found.append(current)
    return [" ".join(p) for p in found]


def test_paragraphs_are_split_at_the_right_places():
    text = "one two\nthree\n\n- a b\n- c\n  d\n\n| x |\n|---|\n\n```\ncode here\n```\n# head\nlast"
    assert paragraphs(text) == ["one two three", "- a b", "- c d", "last"]


@pytest.mark.parametrize("path", [p for p in _doc_files() if p.suffix == ".md"],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_no_paragraph_is_longer_than_150_words(path):
    text = path.read_text(encoding="utf-8")
    long = [f"{len(p.split())} words: {p[:80]}..." for p in paragraphs(text)
            if len(p.split()) > MAX_WORDS]
    assert long == [], "\n".join(long)


def test_the_readme_is_at_most_200_lines():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= MAX_README_LINES


# ---------------------------------------------------------------------------- links, citations
def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def _headings(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return [m.group(1) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)]


def test_every_link_between_pages_reaches_its_file_and_heading():
    broken = []
    for path in _doc_files():
        if path.suffix != ".md":
            continue
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                broken.append(f"{path.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.is_file() and anchor not in {slug(h) for h in _headings(dest)}:
                broken.append(f"{path.relative_to(REPO)}: {target} (no such heading)")
    assert broken == [], "\n".join(broken)


def test_every_section_the_code_cites_exists():
    # docs/design.md, "The stability rung"; ``docs/design.md`` ("Adaptive seeds", "Step halving")
    cited = re.compile(r'docs/([\w/]+\.md)`*(?:,\s*|\s*\(\s*)((?:"[^"]{1,80}",?\s*)+)')
    missing = []
    for root in ("geosearch", "tests", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")) + sorted((REPO / root).rglob("*.yaml")):
            text = path.read_text(encoding="utf-8").replace('\\"', '"')
            text = re.sub(r"\s*\n\s*(?:# ?)?", " ", text)
            for doc, names in cited.findall(text):
                page = (REPO / "docs" / doc).read_text(encoding="utf-8")
                heads = [h.replace("`", "") for h in _headings(REPO / "docs" / doc)]
                for name in re.findall(r'"([^"]+)"', names):
                    if not (any(h.startswith(name) for h in heads) or f"**{name}" in page):
                        missing.append(f"{path.relative_to(REPO)} cites docs/{doc}, {name!r}")
    assert missing == [], "\n".join(missing)


# ----------------------------------------------------------------------------------------
# docs/reference/: each page's module table is the package's modules with the first sentence
# of each docstring, written by `python tests/test_docs.py --write-reference`.
REFERENCE = {"util.md": "util", "manifolds.md": "manifolds", "rules.md": "rules",
             "models.md": "models", "optim.md": "optim", "geosearch.md": "", "proxy.md": "proxy",
             "search.md": "search", "report.md": "report", "cli.md": "cli"}
"""Reference page -> its package under ``geosearch/`` (``""``: the top-level modules)."""
MODULE_TABLE = "| module | what it holds |"
REGENERATE = "python tests/test_docs.py --write-reference"


def first_sentence(doc: str) -> str:
    """A docstring's first sentence as markdown: its first paragraph up to the first full
    stop that ends a sentence, roles (``:func:`~a.b``) and double backticks as code."""
    text = re.sub(r"\s+", " ", doc.strip().split("\n\n")[0]).strip()
    text = re.sub(r":\w+:`(~?)([^`]+)`",
                  lambda m: f"`{m.group(2).split('.')[-1] if m.group(1) else m.group(2)}`", text)
    text = text.replace("``", "`")
    end = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.(?= [A-Z`(]|$)", text)
    return text[: end.end()] if end else text


def module_table(package: str) -> dict[str, str]:
    """Every module of ``geosearch/<package>`` (its sub-packages' too; ``""``: the top-level
    modules only), path -> the first sentence of its docstring. ``__init__`` and
    ``__main__`` are the package, not a module of it."""
    import ast

    root = REPO / "geosearch" / package
    paths = root.rglob("*.py") if package else root.glob("*.py")
    table = {}
    for path in sorted(paths):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        table[path.relative_to(root).as_posix()] = first_sentence(doc)
    return table


def _cells(package: str) -> dict[str, str]:
    """:func:`module_table` as table cells (a ``|`` escaped)."""
    return {m: s.replace("|", "\\|") for m, s in module_table(package).items()}


def _table_span(lines: list[str]) -> tuple[int, int]:
    """The rows of a page's module table: [start, stop) of ``lines``."""
    start = lines.index(MODULE_TABLE) + 2
    stop = start
    while stop < len(lines) and lines[stop].startswith("| `"):
        stop += 1
    return start, stop


def written_table(page: str) -> dict[str, str]:
    """A reference page's module table as written: path -> summary."""
    lines = (REPO / "docs" / "reference" / page).read_text(encoding="utf-8").splitlines()
    start, stop = _table_span(lines)
    rows = [re.match(r"\| `([^`]+)` \| (.*) \|$", line) for line in lines[start:stop]]
    return {m.group(1): m.group(2) for m in rows if m}


def write_reference() -> list[str]:
    """Rewrite every reference page's module table from the package; the pages' other prose
    is kept. Returns the pages changed."""
    changed = []
    for page, package in REFERENCE.items():
        path = REPO / "docs" / "reference" / page
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        start, stop = _table_span(lines)
        rows = [f"| `{m}` | {cell} |" for m, cell in _cells(package).items()]
        new = "\n".join(lines[:start] + rows + lines[stop:]) + "\n"
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


@pytest.mark.parametrize("page", sorted(REFERENCE))
def test_each_reference_page_lists_its_packages_modules_as_their_docstrings_say(page):
    written = written_table(page)
    code = _cells(REFERENCE[page])
    wrong = [f"{m}: listed, but no such module" for m in written if m not in code]
    wrong += [f"{m}: a module the page does not list" for m in code if m not in written]
    wrong += [f"{m}: the page says {written[m]!r}, its docstring {code[m]!r}"
              for m in code if m in written and written[m] != code[m]]
    assert wrong == [], (f"docs/reference/{page} disagrees with geosearch/{REFERENCE[page]} "
                         f"(regenerate with `{REGENERATE}`):\n" + "\n".join(wrong))


def test_first_sentence_ends_at_the_first_full_stop_and_reads_as_markdown():
    doc = ("The plan (:func:`~geosearch.search.space.plan.plan_study`), e.g. ``rungs``. More\n"
           "text.\n\nA second paragraph.")
    assert first_sentence(doc) == "The plan (`plan_study`), e.g. `rungs`."
    assert first_sentence("User-facing errors.") == "User-facing errors."


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-reference"]:
        sys.exit(f"usage: {REGENERATE}")
    for page in write_reference():
        print(f"rewrote docs/reference/{page}")
