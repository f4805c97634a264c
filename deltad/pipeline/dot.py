"""The attractor DOT subset, parsed by hand: one `digraph`, `->` edges (chained), `node [...]` and
`edge [...]` defaults scoped as Graphviz scopes them, graph attributes (`graph [...]` and
`key = value`), subgraphs flattened, `//`, `/* */` and `#` comments, quoted strings.

Why not pydot: it reports a syntax error by printing to stdout and returning None, accepts `--`
in a digraph, `strict` and several graphs per file, hands default blocks back as nodes named
`node`/`edge` (the scoping would still be ours), keeps quotes and escapes in values, keeps no
line numbers on what it parsed, and its first parse builds a pyparsing grammar (~0.5 s).

The result is untyped (`DotGraph`: strings with their positions); `model.py` gives it types.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

from .problems import Pos

NODE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ATTR_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
KEYWORDS = {"digraph", "graph", "subgraph", "node", "edge", "strict"}
MAX_NESTING = 64  # subgraphs inside subgraphs; deeper is a mistake, not a pipeline

_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}


class DotSyntaxError(Exception):
    def __init__(self, message: str, pos: Pos) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


class Tok(Enum):
    WORD = "word"  # an identifier, a number or a bare value like 900s
    STRING = "string"  # a quoted string, unescaped
    PUNCT = "punct"  # { } [ ] = ; , -> --
    END = "end"


class Token(NamedTuple):  # a tuple: a large file has hundreds of thousands
    kind: Tok
    text: str
    pos: Pos

    def shown(self) -> str:
        if self.kind == Tok.END:
            return "the end of the file"
        if self.kind == Tok.STRING:
            return f"the string {_quote(self.text)}"
        return repr(self.text)


def _quote(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


# One match per token, with the blanks before it (a character at a time made a large file
# slow). `-` belongs to a bare value (`a-b`, `-1`) but never starts `->` or `--`; `\s` is
# str.isspace() for str patterns.
_TOKEN = re.compile(
    r"""\s*(?:
     (?P<comment>//[^\n]*|\#[^\n]*)
    |(?P<arrow>->|--)
    |(?P<punct>[{}\[\]=;,])
    |(?P<word>(?:[A-Za-z0-9_.:]|-(?=[A-Za-z0-9_.:]))+)
    |(?P<string>"[^"\\\n]*")
    )""",
    re.VERBOSE,
)
_BLANKS = re.compile(r"\s*")
_PLAIN_RUN = re.compile(r'[^"\\]+')  # inside a string: up to a quote or a backslash


class _Lexer:
    """A position is worked out from the offset: its line from where the newlines are."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.newlines = [m.start() for m in re.finditer("\n", text)]

    def pos_at(self, i: int) -> Pos:
        line = bisect.bisect_left(self.newlines, i)  # newlines before i
        return Pos(line + 1, i - (self.newlines[line - 1] + 1 if line else 0) + 1)

    def pos(self) -> Pos:
        return self.pos_at(self.i)

    def peek(self, ahead: int = 0) -> str:
        j = self.i + ahead
        return self.text[j] if j < len(self.text) else ""

    def advance(self, n: int = 1) -> None:
        self.i += n

    def tokens(self) -> Iterator[Token]:
        """Most tokens are one match of `_TOKEN`; the rest (a string with escapes or newlines,
        a block comment, the end, an error) go through `rest`."""
        text, match, pos_at = self.text, _TOKEN.match, self.pos_at  # looked up once
        word, string, punct = Tok.WORD, Tok.STRING, Tok.PUNCT
        while True:
            found = match(text, self.i)
            if found is None:
                self.i = _end(_BLANKS, text, self.i)
                tok = self.rest(self.pos())
                if tok is not None:
                    yield tok
                if tok is not None and tok.kind == Tok.END:
                    return
                continue
            kind = found.lastgroup or ""
            self.i = found.end()
            if kind == "comment":
                continue
            pos = pos_at(found.start(kind))
            if kind == "word":
                yield Token(word, found.group(kind), pos)
            elif kind == "string":
                yield Token(string, found.group(kind)[1:-1], pos)
            else:  # arrow, punct
                yield Token(punct, found.group(kind), pos)

    def rest(self, pos: Pos) -> Token | None:
        """The token `_TOKEN` does not match here, or None after a block comment."""
        c = self.peek()
        if not c:
            return Token(Tok.END, "", pos)
        if c + self.peek(1) == "/*":
            self.block_comment(pos)
            return None
        if c == '"':
            return Token(Tok.STRING, self.string(pos), pos)
        if c == "<":
            raise DotSyntaxError("HTML labels (<...>) are not supported; use a quoted string", pos)
        raise DotSyntaxError(f"unexpected character {c!r}", pos)

    def block_comment(self, start: Pos) -> None:
        end = self.text.find("*/", self.i + 2)
        if end < 0:
            raise DotSyntaxError("a /* comment is never closed", start)
        self.i = end + 2

    def string(self, start: Pos) -> str:
        self.advance()  # the opening quote
        out: list[str] = []
        while True:
            c = self.peek()
            if not c:
                raise DotSyntaxError("a quoted string is never closed", start)
            if c == '"':
                self.advance()
                return "".join(out)
            if c == "\\" and self.peek(1) == "\n":  # Graphviz line continuation
                self.advance(2)
            elif c == "\\" and self.peek(1):
                nxt = self.peek(1)
                out.append(_ESCAPES.get(nxt, "\\" + nxt))  # \l, \N...: kept as written
                self.advance(2)
            else:
                end = max(_end(_PLAIN_RUN, self.text, self.i), self.i + 1)  # a lone backslash too
                out.append(self.text[self.i : end])
                self.i = end


def _end(run: re.Pattern[str], text: str, i: int) -> int:
    """Where the run starting at `i` ends."""
    found = run.match(text, i)
    return found.end() if found else i


class Attr(NamedTuple):  # a tuple: there is one per attribute written
    value: str
    pos: Pos  # where the value was written (for a default: in its `node [...]` block)


Attrs = dict[str, Attr]


@dataclass
class RawNode:
    id: str
    pos: Pos  # its first declaration, else its first mention in an edge
    attrs: Attrs
    declared: bool = False  # named in a node statement, not only in edges
    own: set[str] = field(default_factory=set)  # keys its own statements set (not defaults)


@dataclass(slots=True)  # not frozen: a frozen dataclass is slow to build, and there are many
class RawEdge:
    source: str
    target: str
    pos: Pos
    attrs: Attrs


@dataclass
class DotGraph:
    name: str | None
    attrs: Attrs = field(default_factory=dict)
    nodes: dict[str, RawNode] = field(default_factory=dict)
    edges: list[RawEdge] = field(default_factory=list)


@dataclass(frozen=True)
class _Scope:
    """Defaults in force at this point: a subgraph starts with a copy of its parent's."""

    node: Attrs
    edge: Attrs
    attrs: Attrs  # where `graph [...]` and `key = value` go (the subgraph's own are dropped)
    depth: int

    def child(self) -> _Scope:
        return _Scope(dict(self.node), dict(self.edge), {}, self.depth + 1)


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = list(_Lexer(text).tokens())
        self.toks.append(self.toks[-1])  # END again: peek(1) at the end needs no bounds check
        self.i = 0

    # -- tokens ---------------------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token:
        return self.toks[self.i + ahead]

    def take(self) -> Token:
        tok = self.toks[self.i]
        if tok.kind is not Tok.END:  # the END token is taken forever
            self.i += 1
        return tok

    def at(self, punct: str, ahead: int = 0) -> bool:
        tok = self.toks[self.i + ahead]
        return tok.text == punct and tok.kind is Tok.PUNCT

    def at_keyword(self, word: str) -> bool:
        tok = self.peek()
        return tok.kind == Tok.WORD and tok.text.lower() == word

    def expect(self, punct: str, why: str) -> Token:
        if not self.at(punct):
            tok = self.peek()
            raise DotSyntaxError(f"expected {punct!r} {why}, found {tok.shown()}", tok.pos)
        return self.take()

    # -- grammar --------------------------------------------------------------------------
    def graph(self) -> DotGraph:
        first = self.take()
        word = first.text.lower() if first.kind == Tok.WORD else ""
        if word == "strict":
            raise DotSyntaxError(
                "strict graphs are not supported: write 'digraph NAME {'", first.pos
            )
        if word == "graph":
            raise DotSyntaxError("a pipeline is a digraph (directed), not a graph", first.pos)
        if word != "digraph":
            raise DotSyntaxError(f"expected 'digraph', found {first.shown()}", first.pos)
        name = None
        if self.peek().kind in (Tok.WORD, Tok.STRING):
            name = self.take().text
        opening = self.expect("{", "to open the digraph")
        dot = DotGraph(name)
        self.statements(dot, _Scope({}, {}, dot.attrs, 0), opening)
        self.take()  # the closing brace
        if (extra := self.peek()).kind != Tok.END:
            raise DotSyntaxError(
                f"{extra.shown()} after the digraph's closing brace: one digraph per file",
                extra.pos,
            )
        return dot

    def statements(self, dot: DotGraph, scope: _Scope, opening: Token) -> None:
        while not self.at("}"):
            if self.peek().kind == Tok.END:
                raise DotSyntaxError(
                    f"the '{{' on line {opening.pos.line} is never closed", self.peek().pos
                )
            self.statement(dot, scope)
            while self.at(";"):
                self.take()

    def statement(self, dot: DotGraph, scope: _Scope) -> None:
        tok = self.peek()
        if self.at("{") or self.at_keyword("subgraph"):
            self.subgraph(dot, scope)
        elif tok.kind == Tok.WORD and tok.text.lower() in ("graph", "node", "edge"):
            self.take()
            if not self.at("["):
                raise DotSyntaxError(f"expected '[' after {tok.text!r}", self.peek().pos)
            target = {"graph": scope.attrs, "node": scope.node, "edge": scope.edge}
            target[tok.text.lower()].update(self.attr_lists())
        elif tok.kind in (Tok.WORD, Tok.STRING) and self.at("=", 1):
            key = self.attr_key()
            self.take()
            scope.attrs[key] = self.attr_value(key)
        elif tok.kind in (Tok.WORD, Tok.STRING):
            self.node_or_edges(dot, scope)
        else:
            raise DotSyntaxError(f"expected a statement, found {tok.shown()}", tok.pos)

    def subgraph(self, dot: DotGraph, scope: _Scope) -> None:
        start = self.peek()
        if self.at_keyword("subgraph"):
            self.take()
            if self.peek().kind in (Tok.WORD, Tok.STRING):
                self.take()
        if scope.depth >= MAX_NESTING:
            raise DotSyntaxError(f"subgraphs nested more than {MAX_NESTING} deep", start.pos)
        opening = self.expect("{", "to open the subgraph")
        self.statements(dot, scope.child(), opening)
        self.take()
        if self.at("->") or self.at("--"):
            raise DotSyntaxError(
                "a subgraph as an edge end is not supported: write one edge per node", start.pos
            )

    def node_or_edges(self, dot: DotGraph, scope: _Scope) -> None:
        ends = [self.node_id()]
        while self.at("->") or self.at("--"):
            arrow = self.take()
            if arrow.text == "--":
                raise DotSyntaxError("'--' is an undirected edge; a digraph uses '->'", arrow.pos)
            if self.at("{") or self.at_keyword("subgraph"):
                raise DotSyntaxError(
                    "a subgraph as an edge end is not supported: write one edge per node",
                    self.peek().pos,
                )
            ends.append(self.node_id())
        attrs = self.attr_lists() if self.at("[") else {}
        if len(ends) == 1:
            node = self.touch(dot, scope, ends[0])
            if not node.declared:
                node.declared, node.pos = True, ends[0].pos
            node.attrs.update(attrs)
            node.own.update(attrs)
            return
        for src, dst in itertools.pairwise(ends):
            self.touch(dot, scope, src)
            self.touch(dot, scope, dst)
            dot.edges.append(RawEdge(src.text, dst.text, src.pos, {**scope.edge, **attrs}))

    def touch(self, dot: DotGraph, scope: _Scope, tok: Token) -> RawNode:
        """Graphviz creates a node at its first mention, with the defaults in force there."""
        if tok.text not in dot.nodes:
            dot.nodes[tok.text] = RawNode(tok.text, tok.pos, dict(scope.node))
        return dot.nodes[tok.text]

    def node_id(self) -> Token:
        tok = self.take()
        if tok.kind not in (Tok.WORD, Tok.STRING):
            raise DotSyntaxError(f"expected a node id, found {tok.shown()}", tok.pos)
        if tok.kind == Tok.WORD and tok.text.lower() in KEYWORDS:
            raise DotSyntaxError(f"{tok.text!r} is a DOT keyword, not a node id", tok.pos)
        if not NODE_ID.fullmatch(tok.text):
            raise DotSyntaxError(
                f"node id {_quote(tok.text)} must be letters, digits and _ (not starting with a "
                "digit); put a display name in label",
                tok.pos,
            )
        return tok

    def attr_lists(self) -> Attrs:
        """`[k=v, k=v] [k=v]`: commas, semicolons or spaces between; the last value wins."""
        attrs: Attrs = {}
        while self.at("["):
            opening = self.take()
            while not self.at("]"):
                key = self.attr_key()
                self.expect("=", f"after attribute {key!r} (in the '[' of line {opening.pos.line})")
                attrs[key] = self.attr_value(key)
                while self.at(",") or self.at(";"):
                    self.take()
            self.take()
        return attrs

    def attr_key(self) -> str:
        tok = self.take()
        if tok.kind == Tok.STRING or (tok.kind == Tok.WORD and ATTR_KEY.fullmatch(tok.text)):
            return tok.text
        if tok.kind == Tok.WORD:
            raise DotSyntaxError(f"{_quote(tok.text)} is not an attribute name", tok.pos)
        raise DotSyntaxError(f"expected an attribute name, found {tok.shown()}", tok.pos)

    def attr_value(self, key: str) -> Attr:
        tok = self.take()
        if tok.kind not in (Tok.WORD, Tok.STRING):
            raise DotSyntaxError(f"attribute {key!r} needs a value, found {tok.shown()}", tok.pos)
        return Attr(tok.text, tok.pos)


def parse_dot(text: str) -> DotGraph:
    """Parse one digraph; raises DotSyntaxError (with its line and column) at the first error."""
    return _Parser(text).graph()
