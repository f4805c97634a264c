"""tests/docblocks.py: which blocks of a page run and how, read from its Markdown; a transcript's
commands and what their output must match. The pages of this checkout must read without a
MarkError (tests/e2e/test_docs_contract.py runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import docblocks
from tests.docblocks import Block, Command, MarkError, NotRun, Run

REPO = Path(__file__).resolve().parents[2]


def _blocks(text: str) -> list[Block]:
    return docblocks.blocks("docs/x.md", text)


def test_shell_fences_are_found_with_their_lines_and_sections() -> None:
    page = """# Title

```sh
echo one
```

## Second

```python
print("not shell")
```

~~~bash
echo two
~~~

```console
$ echo three
three
```

```Shell
echo four
```
"""
    found = _blocks(page)
    assert [(b.line, b.info, b.text, b.heading) for b in found] == [
        (3, "sh", "echo one", "Title"),
        (13, "bash", "echo two", "Second"),
        (17, "console", "$ echo three\nthree", "Second"),
        (22, "shell", "echo four", "Second"),
    ]
    assert all(b.mark == Run() for b in found)
    assert found[0].where == 'docs/x.md:3: ```sh block in "Title"'


def test_a_longer_fence_holds_shorter_ones_and_indented_blocks_lose_their_indent() -> None:
    page = """````markdown
```sh
not a block of its own
```
````

1. A step:

   ```sh
   echo in a list
     still indented
   ```
"""
    [block] = _blocks(page)
    assert (block.line, block.text) == (9, "echo in a list\n  still indented")


def test_headings_and_marks_inside_other_fences_are_content() -> None:
    page = """# Real

```markdown
# not a heading
<!-- not run: inside a fence -->
```
```sh
true
```
"""
    [block] = _blocks(page)
    assert (block.heading, block.mark) == ("Real", Run())


@pytest.mark.parametrize(
    ("mark", "parsed"),
    [
        ("<!-- not run: needs a Kubernetes cluster -->", NotRun("needs a Kubernetes cluster")),
        ("<!--not run:   spaces   -->", NotRun("spaces")),
        ("<!-- run -->", Run()),
        ("<!-- run: background -->", Run(background=True)),
        (
            "<!-- run: background; ready: http://127.0.0.1:8470/readyz -->",
            Run(background=True, ready="http://127.0.0.1:8470/readyz"),
        ),
        (
            "<!-- run: background; ready: deltad status --state-dir s -->",
            Run(background=True, ready="deltad status --state-dir s"),
        ),
        ("<!-- run: interrupt; timeout: 5 -->", Run(interrupt=True, timeout=5.0)),
        ("<!-- run: exit: 3 -->", Run(exit=3)),
    ],
)
def test_marks(mark: str, parsed: Run | NotRun) -> None:
    [block] = _blocks(f"{mark}\n```sh\ntrue\n```\n")
    assert block.mark == parsed


@pytest.mark.parametrize(
    ("mark", "why"),
    [
        ("<!-- not run -->", "needs its reason"),
        ("<!-- not run:   -->", "needs its reason"),
        ("<!-- run: backgrund -->", "unknown run option 'backgrund'"),
        ("<!-- run: exit: three -->", "unknown run option 'exit: three'"),
        ("<!-- run: timeout: 0 -->", "unknown run option 'timeout: 0'"),
        ("<!-- run: ready: http://x/ -->", "`ready:` goes with `background`"),
        ("<!-- run: background; exit: 1 -->", "a background block neither ends"),
        ("<!-- run: interrupt; exit: 1 -->", "no exit status to check"),
        ("<!-- run please -->", "a run mark reads"),
    ],
)
def test_marks_that_cannot_be_read_say_where_and_why(mark: str, why: str) -> None:
    with pytest.raises(MarkError, match=r"^docs/x\.md:1: ") as e:
        _blocks(f"{mark}\n```sh\ntrue\n```\n")
    assert why in str(e.value)


@pytest.mark.parametrize(
    "page",
    [
        "<!-- not run: a reason -->\n\n```sh\ntrue\n```\n",  # a blank line between
        "<!-- not run: a reason -->\nSome prose.\n```sh\ntrue\n```\n",
        "<!-- not run: a reason -->\n```yaml\na: 1\n```\n",  # not a shell block
        "<!-- not run: a reason -->\n",
    ],
)
def test_a_mark_stands_right_before_a_shell_fence(page: str) -> None:
    with pytest.raises(MarkError, match=r"^docs/x\.md:1: a mark"):
        _blocks(page)


def test_other_comments_are_not_marks() -> None:
    page = "<!-- a note for editors -->\n```sh\ntrue\n```\n<!-- running: later -->\n"
    [block] = _blocks(page)
    assert block.mark == Run()


def test_hidden_blocks_run_in_order_and_say_where_they_are() -> None:
    page = """# Setup

<!-- run hidden: a file the prose describes
printf 'a\\n' > a.txt
-->

```sh
cat a.txt
```
"""
    hidden, shown = _blocks(page)
    assert (hidden.info, hidden.line, hidden.text, hidden.mark) == (
        "hidden",
        3,
        "printf 'a\\n' > a.txt",
        Run(),
    )
    assert hidden.where == 'docs/x.md:3: hidden block in "Setup"'
    assert shown.line == 7


def test_a_hidden_block_needs_its_own_closing_line() -> None:
    with pytest.raises(MarkError, match=r"docs/x\.md:1: a hidden block needs `-->`"):
        _blocks("<!-- run hidden:\ntrue\n")
    with pytest.raises(MarkError, match="on a line of its own"):
        _blocks("<!-- run hidden: true -->\n")


def test_transcript_commands_with_their_output() -> None:
    page = """```sh
$ delta run --agent examples/hello-agent \\
    --task "Greet me"
Run 20261121_080129_f97880 is waiting for input.

$ echo $?
101
$ delta respond Ada
$ delta run
Hello Ada!

```
"""
    [block] = _blocks(page)
    assert docblocks.is_transcript(block)
    cmds = docblocks.commands(block)
    assert cmds == [
        Command(
            2,
            'delta run --agent examples/hello-agent \\\n    --task "Greet me"',
            ("Run 20261121_080129_f97880 is waiting for input.",),
        ),
        Command(6, "echo $?", ("101",)),
        Command(8, "delta respond Ada", ()),
        Command(9, "delta run", ("Hello Ada!",)),
    ]
    assert docblocks.reads_status(cmds[1]) and not docblocks.reads_status(cmds[2])
    assert not docblocks.reads_status(None)


def test_a_script_is_not_a_transcript() -> None:
    [block] = _blocks("```sh\n# $ is a price here\necho '$ 5'\n```\n")
    assert not docblocks.is_transcript(block)


@pytest.mark.parametrize(
    ("shown", "printed"),
    [
        (("Hello Ada!",), "Hello Ada!\n"),
        (("Hello Ada!",), "Hello Ada!   \n\n\n"),  # trailing blanks
        (("Run 20261121_080129_f97880 is waiting",), "Run 20271231_235959_0a1b2c is waiting\n"),
        (
            ('{"id": "6f1e0c3a-1b2c-4d5e-8f90-a1b2c3d4e5f6", "at": "2026-11-21T08:01:29Z"}',),
            '{"id": "00000000-1111-2222-3333-444444444444", "at": "2027-01-02T03:04:05.123456Z"}',
        ),
        (("token: dlt_abcdefghijk",), "token: dlt_OtIiyUw5AgH8p4z9woGhYJw\n"),
        (
            ("Nodes (6):", "  start  ...", "  ...", "Gates (1):"),
            "Nodes (6):\n  start  x\n  a\n  b\nGates (1):\n",
        ),
        (("Nodes (6):", "...", "Gates (1):"), "Nodes (6):\nGates (1):\n"),  # no lines at all
        (("Answer: ... or ...",), "Answer: delta respond X or echo\n"),
        ((), "anything at all\n"),  # nothing shown: not compared
    ],
)
def test_output_that_matches(shown: tuple[str, ...], printed: str) -> None:
    assert docblocks.mismatch(shown, printed) is None


@pytest.mark.parametrize(
    ("shown", "printed"),
    [
        (("Hello Ada!",), "Hello Bob!\n"),
        (("Hello Ada!",), "Hello Ada!\nand more\n"),  # lines not shown need a `...`
        (("  indented",), "indented\n"),
        (("a", "...", "c"), "a\nb\n"),
        (("Run 20261121_080129_f97880",), "Run 20261121_080129\n"),
    ],
)
def test_output_that_does_not_match_gives_a_diff(shown: tuple[str, ...], printed: str) -> None:
    diff = docblocks.mismatch(shown, printed)
    assert diff is not None and "--- shown in the docs" in diff and "+++ printed" in diff


def test_pages_and_their_ids() -> None:
    pages = docblocks.pages(REPO)
    assert pages[0] == REPO / "README.md"
    assert REPO / "docs" / "inbox.md" in pages
    assert [docblocks.page_id(REPO, p) for p in pages[:1]] == ["README"]


@pytest.mark.parametrize("page", docblocks.pages(REPO), ids=lambda p: p.stem)
def test_every_block_of_the_docs_runs_or_says_why_not(page: Path) -> None:
    """Cheap, before the e2e run: every mark of the checkout's pages reads (a `not run` has its
    reason), and each shell block runs or is marked not run."""
    for block in docblocks.blocks(str(page.relative_to(REPO)), page.read_text()):
        assert isinstance(block.mark, Run) or block.mark.reason, block.where
