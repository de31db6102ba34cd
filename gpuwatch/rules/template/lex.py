"""Tokens of Go's text/template, as its lexer cuts them.

Positions are byte offsets into the whole template text: Go's error messages name them, and
Prometheus prefixes every rule template with its variable definitions, so they are part of
what an author reads."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto


class TemplateError(ValueError):
    """A template that does not parse or does not run."""


class Kind(Enum):
    TEXT = auto()
    LEFT = auto()  # {{
    RIGHT = auto()  # }}
    SPACE = auto()
    IDENT = auto()  # a function name
    KEYWORD = auto()  # if else end range with define template block break continue
    FIELD = auto()  # .Name
    DOT = auto()  # .
    VARIABLE = auto()  # $ or $name
    DECLARE = auto()  # :=
    ASSIGN = auto()  # =
    PIPE = auto()  # |
    LPAREN = auto()
    RPAREN = auto()
    COMMA = auto()
    STRING = auto()  # "..." or `...`, the source text kept
    CHAR = auto()  # 'x'
    NUMBER = auto()
    BOOL = auto()
    NIL = auto()
    COMMENT = auto()
    OTHER = auto()  # a printable ASCII character the grammar has no use for: `@`, `;`
    ERROR = auto()  # the lexer stopped here; the text is why
    EOF = auto()


KEYWORDS = frozenset(
    ("if", "else", "end", "range", "with", "define", "template", "block", "break", "continue")
)
_SPACE = " \t\r\n"


@dataclass(frozen=True, slots=True)
class Token:
    kind: Kind
    text: str
    pos: int


def _code_point(c: str) -> str:
    """Go's %#U: U+0040 '@'."""
    return f"U+{ord(c):04X} '{c}'"


def _is_alnum(c: str) -> bool:
    return c == "_" or c.isalpha() or c.isdigit()


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.tokens: list[Token] = []
        self.paren_depth = 0

    def emit(self, kind: Kind, start: int, end: int) -> None:
        self.tokens.append(Token(kind, self.text[start:end], start))

    def error(self, message: str) -> TemplateError:
        line = self.text.count("\n", 0, self.pos) + 1
        return TemplateError(f"{line}: {message}")

    def run(self) -> list[Token]:
        """The tokens up to the end or to the first error, which becomes an ERROR token: as
        in Go, whose lexer runs a step ahead of the parser, a parse error before it wins."""
        try:
            self._run()
        except TemplateError as exc:
            self.tokens.append(Token(Kind.ERROR, str(exc), self.pos))
            self.tokens.append(Token(Kind.EOF, "", len(self.text)))
            return self.tokens
        self.tokens.append(Token(Kind.EOF, "", len(self.text)))
        return self.tokens

    def _run(self) -> None:
        text = self.text
        while self.pos < len(text):
            start = self.pos
            left = text.find("{{", start)
            if left < 0:
                self.emit(Kind.TEXT, start, len(text))
                break
            trim = text.startswith("-", left + 2) and text[left + 3 : left + 4] in tuple(_SPACE)
            end = left
            if trim:
                end = len(text[start:left].rstrip(_SPACE)) + start
            if end > start:
                self.emit(Kind.TEXT, start, end)
            self.pos = left + 2 + (2 if trim else 0)
            self.action(left)

    def _right_trim_at(self, pos: int) -> bool:
        return self.text.startswith("-}}", pos)

    def _close(self, pos: int) -> None:
        """After '}}' at pos (or ' -}}' before it): skip the text's leading space if trimmed."""
        self.pos = pos + 2
        self.emit(Kind.RIGHT, pos, pos + 2)

    def action(self, left: int) -> None:
        text = self.text
        self.tokens.append(Token(Kind.LEFT, "{{", left))
        if text.startswith("/*", self.pos):
            self.comment()
            return
        self.paren_depth = 0
        while True:
            if self.pos >= len(text):
                raise self.error("unclosed action")
            c = text[self.pos]
            if text.startswith("}}", self.pos):
                if self.paren_depth:
                    raise self.error("unclosed left paren")
                self._close(self.pos)
                return
            if c in _SPACE:
                start = self.pos
                while self.pos < len(text) and text[self.pos] in _SPACE:
                    self.pos += 1
                if self._right_trim_at(self.pos):
                    if self.paren_depth:
                        raise self.error("unclosed left paren")
                    self._close(self.pos + 1)
                    rest = text[self.pos :]
                    self.pos += len(rest) - len(rest.lstrip(_SPACE))
                    return
                self.emit(Kind.SPACE, start, self.pos)
                continue
            self.token(c)

    def comment(self) -> None:
        text = self.text
        end = text.find("*/", self.pos + 2)
        if end < 0:
            raise self.error("unclosed comment")
        self.emit(Kind.COMMENT, self.pos, end + 2)
        self.pos = end + 2
        if text.startswith(" -}}", self.pos):
            self._close(self.pos + 2)
            rest = text[self.pos :]
            self.pos += len(rest) - len(rest.lstrip(_SPACE))
        elif text.startswith("}}", self.pos):
            self._close(self.pos)
        else:
            raise self.error("comment ends before closing delimiter")

    def token(self, c: str) -> None:
        text, start = self.text, self.pos
        simple = {"=": Kind.ASSIGN, "|": Kind.PIPE, ",": Kind.COMMA}
        if c in simple:
            self.pos += 1
            self.emit(simple[c], start, self.pos)
        elif c == ":":
            if not text.startswith(":=", start):
                raise self.error("expected :=")
            self.pos += 2
            self.emit(Kind.DECLARE, start, self.pos)
        elif c == "(":
            self.paren_depth += 1
            self.pos += 1
            self.emit(Kind.LPAREN, start, self.pos)
        elif c == ")":
            self.paren_depth -= 1
            self.pos += 1
            self.emit(Kind.RPAREN, start, self.pos)
            if self.paren_depth < 0:
                raise self.error("unexpected right paren U+0029 ')'")
        elif c in "\"'":
            self.quoted(c)
        elif c == "`":
            end = text.find("`", start + 1)
            if end < 0:
                raise self.error("unterminated raw quoted string")
            self.pos = end + 1
            self.emit(Kind.STRING, start, self.pos)
        elif c == "$":
            self.pos += 1
            self.word()
            self.emit(Kind.VARIABLE, start, self.pos)
            self.fields()
        elif c == "." and not text[start + 1 : start + 2].isdigit():
            self.pos += 1
            if self.pos < len(text) and _is_alnum(text[self.pos]):
                self.word()
                self.emit(Kind.FIELD, start, self.pos)
                self.fields()
            else:
                self.emit(Kind.DOT, start, self.pos)
        elif c in "+-." or c.isdigit():
            self.number()
        elif _is_alnum(c):
            self.word()
            word = text[start : self.pos]
            kind = (
                Kind.KEYWORD
                if word in KEYWORDS
                else Kind.BOOL
                if word in ("true", "false")
                else Kind.NIL
                if word == "nil"
                else Kind.IDENT
            )
            self.terminator()
            self.emit(kind, start, self.pos)
            if kind is Kind.IDENT:
                self.fields()
        elif c.isascii() and c.isprintable():
            self.pos += 1
            self.emit(Kind.OTHER, start, self.pos)
        else:
            raise self.error(f"unrecognized character in action: {_code_point(c)}")

    def word(self) -> None:
        while self.pos < len(self.text) and _is_alnum(self.text[self.pos]):
            self.pos += 1

    def fields(self) -> None:
        """`.A.B` straight after a variable, field or name: one token each."""
        text = self.text
        while text.startswith(".", self.pos) and _is_alnum(text[self.pos + 1 : self.pos + 2]):
            start = self.pos
            self.pos += 1
            self.word()
            self.emit(Kind.FIELD, start, self.pos)
        self.terminator()

    def terminator(self) -> None:
        if self.pos >= len(self.text):
            return
        c = self.text[self.pos]
        if c in _SPACE or c in ".,|:()=" or self.text.startswith("}}", self.pos):
            return
        raise self.error(f"bad character {_code_point(c)}")

    def quoted(self, quote: str) -> None:
        text, start = self.text, self.pos
        pos = start + 1
        while True:
            if pos >= len(text) or text[pos] == "\n":
                what = "quoted string" if quote == '"' else "character constant"
                raise self.error(f"unterminated {what}")
            if text[pos] == "\\":
                pos += 2
                continue
            if text[pos] == quote:
                break
            pos += 1
        self.pos = pos + 1
        self.emit(Kind.STRING if quote == '"' else Kind.CHAR, start, self.pos)

    def number(self) -> None:
        text, start = self.text, self.pos
        pos = start
        if text[pos] in "+-":
            pos += 1
        digits = "0123456789_"
        if text.startswith(("0x", "0X"), pos):
            pos += 2
            digits = "0123456789abcdefABCDEF_"
        elif text.startswith(("0o", "0O"), pos):
            pos += 2
            digits = "01234567_"
        elif text.startswith(("0b", "0B"), pos):
            pos += 2
            digits = "01_"
        while pos < len(text) and text[pos] in digits:
            pos += 1
        if text.startswith(".", pos):
            pos += 1
            while pos < len(text) and text[pos] in digits:
                pos += 1
        exponent = {"0123456789_": "eE", "0123456789abcdefABCDEF_": "pP"}.get(digits, "")
        if pos < len(text) and text[pos] in exponent:
            pos += 1
            if pos < len(text) and text[pos] in "+-":
                pos += 1
            while pos < len(text) and text[pos] in "0123456789_":
                pos += 1
        if text.startswith("i", pos):  # an imaginary constant
            pos += 1
        if pos < len(text) and _is_alnum(text[pos]):
            raise self.error(f'bad number syntax: "{text[start : pos + 1]}"')
        self.pos = pos
        self.emit(Kind.NUMBER, start, pos)


def lex(text: str) -> list[Token]:
    return _Lexer(text).run()
