"""The docs a newcomer navigates: README.md and docs/*.md.

Fast and starts no process. What it holds them to:

- the README stays short (at most `MAX_README_LINES` lines): the reference lives in docs/;
- every heading in docs/ is reachable from the README: the README links every docs file, and each
  docs file opens (after its title) with a contents list that links each of its headings;
- every relative link and `#anchor` resolves, with GitHub's heading slugs (lowercase, punctuation
  other than `-` and `_` dropped, spaces to `-`, a repeated heading gets `-1`, `-2`, ...);
- docs/options.md lists exactly the options the real addon registers, with their types, defaults
  and help texts, so the two cannot drift;
- no line names an issue number: a newcomer cannot look one up;
- docs/repair-rules.md's table "Which verdict a stream gets" says over which verdicts `malformed`
  wins exactly as the core's `MALFORMED_OUTRANKS` does.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mitmproxy.test import taddons

from finishline import MALFORMED_OUTRANKS, Verdict
from finishline.addon import cut_hook
from finishline.addon.hooks import FinishFix

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
OPTIONS_DOC = DOCS / "options.md"
RULES_DOC = DOCS / "repair-rules.md"
MAX_README_LINES = 250
#: The prefix of every option the addon registers (mitmproxy's own options are not ours to document).
OPTION_PREFIX = "finish_fix_"

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
# GitHub keeps letters, digits, `_`, `-` and spaces of a heading's text; everything else goes.
_NOT_IN_SLUG = re.compile(r"[^\w\- ]")
# An issue or pull request named by number: "issue 9", "issues", "(#13)", "PR #4".
_ISSUE_WORD = re.compile(r"\bissues?\b", re.IGNORECASE)
_NUMBER_SIGN = re.compile(r"#\d")


def doc_files() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def every_page() -> list[Path]:
    return [README, *doc_files()]


def prose(text: str) -> str:
    """The text with fenced code blocks blanked (their lines kept, so line numbers stay true)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of every ATX heading outside code blocks, in order."""
    found = []
    for line in prose(text).splitlines():
        match = _HEADING.match(line)
        if match:
            found.append((len(match.group(1)), match.group(2)))
    return found


def github_slug(title: str) -> str:
    """The anchor GitHub gives a heading (before the de-duplicating suffix)."""
    text = _LINK.sub(r"\1", title).replace("`", "")
    return _NOT_IN_SLUG.sub("", text.lower()).replace(" ", "-")


def anchors(text: str) -> list[str]:
    """Every heading's anchor in order; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = []
    for _, title in headings(text):
        slug = github_slug(title)
        if slug in seen:
            seen[slug] += 1
            result.append(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            result.append(slug)
    return result


def links(text: str) -> list[str]:
    """The targets of the Markdown links outside code (blocks and spans); a link may wrap lines."""
    return [target for _, target in _LINK.findall(_CODE_SPAN.sub("", prose(text)))]


def is_external(target: str) -> bool:
    return re.match(r"^[a-z][a-z0-9+.-]*:", target) is not None


def resolve(page: Path, target: str) -> tuple[Path, str]:
    """The file and the anchor ('' for none) a relative link on `page` points at."""
    path, _, anchor = target.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


# -- the README's length ----------------------------------------------------------------------


def test_the_readme_is_short():
    count = len(README.read_text(encoding="utf-8").splitlines())
    assert count <= MAX_README_LINES, f"README.md has {count} lines; at most {MAX_README_LINES} (move reference to docs/)"


# -- links and anchors ------------------------------------------------------------------------


def test_github_slugs_follow_githubs_rules():
    assert github_slug("Repeating cells: `--repeat N`") == "repeating-cells---repeat-n"
    assert github_slug("A server: `python -m labs.grade server`") == "a-server-python--m-labsgrade-server"
    assert github_slug("The lab's gateways, graded") == "the-labs-gateways-graded"
    assert github_slug("finish_fix in front of the tunnel") == "finish_fix-in-front-of-the-tunnel"
    assert anchors("# A\n## Notes\n```\n## not a heading\n```\n## Notes\n## Notes\n") == ["a", "notes", "notes-1", "notes-2"]


@pytest.mark.parametrize("page", every_page(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if is_external(target):
            continue
        path, anchor = resolve(page, target)
        if not path.exists():
            broken.append(f"{target}: no file {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
        elif anchor and (path.suffix != ".md" or anchor not in anchors(path.read_text(encoding="utf-8"))):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {path.name}")
    assert not broken, f"{page.name}: broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_docs_file():
    linked = {resolve(README, t)[0] for t in links(README.read_text(encoding="utf-8")) if not is_external(t)}
    missing = [p.name for p in doc_files() if p.resolve() not in linked]
    assert doc_files(), "docs/ has no .md file"
    assert not missing, f"README.md links no docs file {', '.join(missing)}"


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: p.name)
def test_each_docs_file_opens_with_a_contents_list_of_its_headings(page):
    text = page.read_text(encoding="utf-8")
    found = headings(text)
    assert found and found[0][0] == 1, f"{page.name}: the first heading must be its title (# ...)"
    assert [level for level, _ in found].count(1) == 1, f"{page.name}: one title (# ...) only"
    # The contents list: the links between the title and the first section heading.
    lines = prose(text).splitlines()
    starts = [i for i, line in enumerate(lines) if _HEADING.match(line)]
    contents = "\n".join(lines[starts[0] + 1 : starts[1]]) if len(starts) > 1 else ""
    listed = [target[1:] for target in links(contents) if target.startswith("#")]
    sections = anchors(text)[1:]
    unlisted = [a for a in sections if a not in listed]
    assert not unlisted, f"{page.name}: the contents list links no #{', #'.join(unlisted)}"
    assert len(listed) == len(set(listed)) == len(sections), f"{page.name}: the contents list should link each heading once"


# -- the options --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def registered():
    """name -> (type name, default, help) of every option the real addon registers in `load`."""
    addon = FinishFix()
    try:
        with taddons.context(addon) as tctx:
            return {
                name: (option.typespec.__name__, option.default, option.help)
                for name, option in tctx.options.items()
                if name.startswith(OPTION_PREFIX)
            }
    finally:
        cut_hook.uninstall()


def _cells(row: str) -> list[str]:
    # `\|` is a literal bar inside a cell (the path regexes' defaults).
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def _code(cell: str) -> str | None:
    match = re.fullmatch(r"`([^`]*)`", cell)
    return match.group(1) if match else None


def documented_table() -> dict[str, tuple[str, str]]:
    """name -> (type, default) from the options table of docs/options.md (`empty` = the empty string)."""
    rows = [line for line in OPTIONS_DOC.read_text(encoding="utf-8").splitlines() if line.startswith("|")]
    assert rows and _cells(rows[0])[:3] == ["option", "type", "default"], "docs/options.md: no | option | type | default | table"
    table = {}
    for row in rows[2:]:
        name, typename, default, *_ = _cells(row)
        option, kind = _code(name), _code(typename)
        default_value = "" if default == "empty" else _code(default)
        assert option and kind and default_value is not None, f"docs/options.md: unreadable row {row!r}"
        table[option] = (kind, default_value)
    return table


def documented_help() -> dict[str, str]:
    """name -> help text, from the list under "The help texts" in docs/options.md."""
    text = OPTIONS_DOC.read_text(encoding="utf-8").split("## The help texts", 1)[1]
    items = re.findall(r"^- `([^`]+)`: (.*?)(?=^- `|\Z)", text, re.MULTILINE | re.DOTALL)
    return {name: " ".join(body.split()) for name, body in items}


def test_the_options_table_is_what_the_addon_registers(registered):
    documented = documented_table()
    actual = {name: (typename, default) for name, (typename, default, _) in registered.items()}
    assert actual, "the addon registered no finish_fix_ option"
    assert sorted(set(actual) - set(documented)) == [], "registered but not in docs/options.md"
    assert sorted(set(documented) - set(actual)) == [], "in docs/options.md but not registered by the addon"
    wrong = {name: (documented[name], actual[name]) for name in actual if documented[name] != actual[name]}
    assert not wrong, f"docs/options.md (type, default) vs the addon's: {wrong}"


def test_the_help_texts_are_the_addons(registered):
    documented = documented_help()
    assert sorted(documented) == sorted(registered), "docs/options.md's help texts: not one per registered option"
    wrong = [name for name, (_, _, text) in registered.items() if documented[name] != " ".join(text.split())]
    assert not wrong, f"docs/options.md: the help of {', '.join(wrong)} is not the addon's (copy it from `load`)"


# -- no issue numbers ---------------------------------------------------------------------------


@pytest.mark.parametrize("page", every_page(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_line_names_an_issue_number(page):
    hits = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        # A `#` and a digit inside code is an output's own text (a repeat's label `healthy #2`).
        if _ISSUE_WORD.search(line) or _NUMBER_SIGN.search(_CODE_SPAN.sub("", line)):
            hits.append(f"{page.name}:{number}: {line.strip()}")
    assert not hits, "issue numbers mean nothing to a newcomer; say what the thing is:\n" + "\n".join(hits)


def documented_precedence() -> tuple[set[Verdict], set[Verdict]]:
    """(what `malformed` outranks, what outranks it) from the table under "Which verdict a stream
    gets" in docs/repair-rules.md. A row booked `malformed` names the verdict it won over in its
    detail (`malformed: ...; repaired: ...`; none: the stream was otherwise `clean`); a row booked
    another verdict is one `malformed` does not win over."""
    section = RULES_DOC.read_text(encoding="utf-8").split("## Which verdict a stream gets", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows and _cells(rows[0])[:3] == ["the stream had", "verdict", "detail"], "docs/repair-rules.md: no verdict table"
    outranked, over_it = set(), set()
    for row in rows[2:]:
        _, verdict, detail, *_ = _cells(row)
        booked = _code(verdict)
        if booked is None:  # "what the rest says": a malformed event that was not read
            continue
        if booked == Verdict.MALFORMED.value:
            # The clause after `; ` that begins with a verdict's name ("passed on as it came" does not).
            named = [Verdict(word) for word in re.findall(r"; (\w+)", detail) if word in {v.value for v in Verdict}]
            outranked.add(named[0] if named else Verdict.CLEAN)
        else:
            over_it.add(Verdict(booked))
    return outranked, over_it


def test_what_malformed_outranks_is_the_verdict_table_of_the_docs():
    outranked, over_it = documented_precedence()
    assert outranked == MALFORMED_OUTRANKS
    assert over_it == {Verdict.SKIPPED, Verdict.HTTP_ERROR}
    assert set(Verdict) == outranked | over_it | {Verdict.MALFORMED}
