"""The shell blocks of the documentation, read as a contract: which run, how, and what output a
transcript promises. Pure functions over the Markdown text; tests/docrun.py runs them.

The convention (docs/writing-docs.md says it in full): every fenced block whose info string is
`sh`, `bash`, `shell` or `console` runs, in document order, in one bash session per page,
unless the line right before its fence is `<!-- not run: REASON -->` (the reason required);
`<!-- run: background; ready: URL -->`, `interrupt`, `exit: N`, `timeout: S` change how it
runs; a block whose first line starts with `$ ` is a transcript whose output is compared; and
`<!-- run hidden:` ... `-->` is set-up the page does not show.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

SHELL_INFOS = frozenset({"sh", "bash", "shell", "console"})
DEFAULT_TIMEOUT = 60.0
HIDDEN_OPEN = "<!-- run hidden:"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)[^`]*$")
_MARK = re.compile(r"^\s*<!--\s*(?P<what>not run|run)\b(?P<rest>.*?)-->\s*$")
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)\s*#*\s*$")


class MarkError(ValueError):
    """A mark that cannot be read: where and why, one line."""


@dataclass(frozen=True)
class Run:
    background: bool = False
    ready: str | None = None
    interrupt: bool = False
    exit: int = 0
    timeout: float = DEFAULT_TIMEOUT


@dataclass(frozen=True)
class NotRun:
    reason: str


@dataclass(frozen=True)
class Block:
    path: str  # as the failure message names it (relative to the repository)
    line: int  # the opening fence's line (a hidden block: its `<!--` line), 1-based
    info: str  # the fence's info string; "hidden" for a hidden block
    text: str  # the block's content, indentation of the fence removed
    mark: Run | NotRun
    heading: str  # the section it is in ("" before the first heading)

    @property
    def where(self) -> str:
        section = f' in "{self.heading}"' if self.heading else ""
        what = "hidden block" if self.info == "hidden" else f"```{self.info} block"
        return f"{self.path}:{self.line}: {what}{section}"

    @property
    def first_line(self) -> int:
        """The document line of the content's first line."""
        return self.line + 1


@dataclass(frozen=True)
class Command:
    line: int  # the document line of its `$ `
    text: str  # the command, continuation lines joined by newlines
    expected: tuple[str, ...]  # the output shown under it (empty: not compared)


def parse_mark(text: str, where: str) -> Run | NotRun | None:
    """The mark a line holds, None when it is no mark (any other comment or text)."""
    m = _MARK.match(text)
    if m is None:
        return None
    rest = m["rest"].strip()
    if m["what"] == "not run":
        reason = rest[1:].strip() if rest.startswith(":") else ""
        if not reason:
            raise MarkError(f"{where}: `<!-- not run: REASON -->` needs its reason")
        return NotRun(reason)
    if rest.startswith("hidden"):
        return None  # a hidden block's opening, read by blocks()
    if not rest:
        return Run()
    if not rest.startswith(":"):
        raise MarkError(f"{where}: a run mark reads `<!-- run: OPTION; OPTION -->`, not {text!r}")
    return _options(rest[1:], where)


def _options(text: str, where: str) -> Run:
    background = interrupt = False
    ready: str | None = None
    code = 0
    timeout = DEFAULT_TIMEOUT
    for raw in text.split(";"):
        opt = raw.strip()
        name, _, value = opt.partition(":")
        name, value = name.strip(), value.strip()
        if not opt:
            continue
        if name == "background" and not value:
            background = True
        elif name == "interrupt" and not value:
            interrupt = True
        elif name == "ready" and value:
            ready = value
        elif name == "exit" and value.isdigit():
            code = int(value)
        elif name == "timeout" and _positive(value):
            timeout = float(value)
        else:
            raise MarkError(
                f"{where}: unknown run option {opt!r} (known: background, ready: URL|COMMAND,"
                " interrupt, exit: N, timeout: SECONDS)"
            )
    if ready is not None and not background:
        raise MarkError(f"{where}: `ready:` goes with `background`")
    if background and (interrupt or code):
        raise MarkError(f"{where}: a background block neither ends (exit) nor is interrupted")
    if interrupt and code:
        raise MarkError(f"{where}: an interrupted block has no exit status to check")
    return Run(background, ready, interrupt, code, timeout)


def _positive(value: str) -> bool:
    try:
        return float(value) > 0
    except ValueError:
        return False


def blocks(path: str, text: str) -> list[Block]:
    """Every shell block and hidden block of a page, in order. Raises MarkError for a mark
    that cannot be read or stands where no shell block follows it."""
    lines = text.split("\n")
    found: list[Block] = []
    heading = ""
    pending: tuple[int, Run | NotRun] | None = None  # a mark on the line just read
    i = 0
    while i < len(lines):
        line = lines[i]
        where = f"{path}:{i + 1}"
        fence = _FENCE.match(line)
        if fence is not None:
            end = _closing(lines, i, fence["fence"])
            info = fence["info"].lower()
            body = _dedent(lines[i + 1 : end], len(fence["indent"]))
            if info in SHELL_INFOS:
                given = pending[1] if pending is not None else Run()
                found.append(Block(path, i + 1, info, body, given, heading))
            elif pending is not None:
                raise MarkError(f"{path}:{pending[0]}: a mark before a ```{info} block")
            pending = None
            i = end + 1
            continue
        if pending is not None:
            raise MarkError(
                f"{path}:{pending[0]}: a mark must stand on the line right before a shell"
                " block's fence"
            )
        if line.strip().startswith(HIDDEN_OPEN):
            if "-->" in line:
                raise MarkError(f"{where}: a hidden block's `-->` goes on a line of its own")
            end = _comment_end(lines, i, path)
            found.append(
                Block(path, i + 1, "hidden", "\n".join(lines[i + 1 : end]), Run(), heading)
            )
            i = end + 1
            continue
        mark = parse_mark(line, where)
        if mark is not None:
            pending = (i + 1, mark)
        elif (h := _HEADING.match(line)) is not None:
            heading = h["title"]
        i += 1
    if pending is not None:
        raise MarkError(f"{path}:{pending[0]}: a mark at the end of the page, before no block")
    return found


def _closing(lines: list[str], start: int, fence: str) -> int:
    """The line that closes the fence opened at `start` (CommonMark: the same character, at
    least as many, nothing after); the page's end when none does."""
    for j in range(start + 1, len(lines)):
        stripped = lines[j].strip()
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
            return j
    return len(lines)


def _comment_end(lines: list[str], start: int, path: str) -> int:
    for j in range(start + 1, len(lines)):
        if lines[j].strip() == "-->":
            return j
    raise MarkError(f"{path}:{start + 1}: a hidden block needs `-->` on a line of its own")


def _dedent(body: list[str], indent: int) -> str:
    """Content lines lose the fence's indentation (a block in a list item), no more."""
    if indent == 0:
        return "\n".join(body)
    return "\n".join(ln[indent:] if ln[:indent].isspace() else ln.lstrip() for ln in body)


def is_transcript(block: Block) -> bool:
    first = next((ln for ln in block.text.split("\n") if ln.strip()), "")
    return first.startswith("$ ") or first == "$"


def commands(block: Block) -> list[Command]:
    """A transcript's commands, each with the output shown under it."""
    found: list[Command] = []
    lines = block.text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if not (line.startswith("$ ") or line == "$"):
            i += 1  # output before the first command: is_transcript() rules it out
            continue
        start = i
        parts = [line[2:]]
        while parts[-1].endswith("\\") and i + 1 < len(lines):
            i += 1
            parts.append(lines[i])
        i += 1
        out: list[str] = []
        while i < len(lines) and not (lines[i].startswith("$ ") or lines[i] == "$"):
            out.append(lines[i])
            i += 1
        while out and not out[-1].strip():
            out.pop()
        found.append(Command(block.first_line + start, "\n".join(parts), tuple(out)))
    return found


def reads_status(command: Command | None) -> bool:
    """Whether a command looks at the status the one before it left (`echo $?`)."""
    return command is not None and ("$?" in command.text or "${?}" in command.text)


# What differs from one run to the next, replaced on both sides before comparing.
_VOLATILE = (
    (re.compile(r"\b\d{8}_\d{6}_[0-9a-f]{6}\b"), "<RUN-ID>"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<UUID>"),
    (
        re.compile(r"\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"),
        "<TIME>",
    ),
    (re.compile(r"\bdlt_[A-Za-z0-9_-]{8,}"), "<TOKEN>"),
)


def normalise(text: str) -> list[str]:
    for pattern, stand_in in _VOLATILE:
        text = pattern.sub(stand_in, text)
    lines = [ln.rstrip() for ln in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _pattern(expected: list[str]) -> re.Pattern[str]:
    parts: list[str] = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.split("...")) + r"\n")
    return re.compile("".join(parts))


def mismatch(expected: tuple[str, ...], actual: str) -> str | None:
    """None when `actual` is what the transcript shows, else a diff saying how it is not."""
    if not expected:
        return None
    want = normalise("\n".join(expected))
    got = normalise(actual)
    if _pattern(want).fullmatch("".join(ln + "\n" for ln in got)):
        return None
    diff = difflib.unified_diff(want, got, "shown in the docs", "printed", lineterm="", n=2)
    return "\n".join(diff)


def pages(repo: Path) -> list[Path]:
    """The pages whose blocks are a contract: README.md and docs/*.md."""
    found = [repo / "README.md"] if (repo / "README.md").is_file() else []
    return found + sorted((repo / "docs").glob("*.md"))


def page_id(repo: Path, page: Path) -> str:
    """What `-k` selects a page by: its file's stem (README, quickstart, inbox)."""
    return page.relative_to(repo).with_suffix("").name
