"""Where in an expression a parse error is, as line:column, and what was found there.

The parser says what is wrong ("invalid promql query", "unclosed left parenthesis") but not
where. The place is found the way a reader finds it: the first token after which no ending
makes the expression valid. Each prefix of the tokens is tried with the endings an
expression can take (an operand, a duration, a label value, then the brackets still open
closed); the first prefix none completes holds the culprit, and when every prefix can be
completed, the input ended too soon. Only run on an error."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import promql_parser as pp

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|`[^`]*`?)
  | (?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*(?![\w:]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<identifier>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<operator>==|!=|>=|<=|=~|!~|[-+*/%^=<>,()\[\]{}:@])
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
# Past these an error is given without its place: the search parses candidates of the
# expression's length, and closing a few thousand open brackets overflows the parser's stack
# (a crash, where the broken expression itself is a clean error). Real rules are far inside.
MAX_LOCATED_CHARS = 2048
MAX_DEPTH = 64
MAX_PARSES = 1500
_CLOSES = {"(": ")", "[": "]", "{": "}"}
# What may stand where the input stopped, by the innermost bracket open there: in braces a
# label value or matcher; in brackets a duration or a subquery's; elsewhere an operand, a
# function's arguments (whole, or the parser's check of them would blame the function's name
# for a fault further on) or grouping labels.
_FILLERS = {
    "{": ("", ' "x"', '="x"', ' ="x"', "x"),
    "[": ("", "5m", "5m:", ":"),
    "(": (
        "", " x", " 1", ' "x"', " 5m", "(x)", " (x)", "x", "1", "x[5m]", "1, x", "1, x[5m]",
        'x, "a", "b", "c", "d"', 'x, "a", "b"',
    ),
}  # fmt: skip
_TAILS = ("", " (x)", " x")
_KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "offset",
                       "bool", "group_left", "group_right"})  # fmt: skip


@dataclass(frozen=True, slots=True)
class Token:
    kind: str
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    def described(self) -> str:
        """As Prometheus names what it did not expect."""
        if self.kind == "identifier" and self.text.lower() not in _KEYWORDS:
            return f'identifier "{self.text}"'
        if self.kind in ("string", "number", "duration"):
            return f"{self.kind} {self.text!r}" if self.kind != "string" else f"string {self.text}"
        return f'"{self.text}"'


def tokens(text: str) -> list[Token]:
    out = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or "other"
        if kind != "space":
            out.append(Token(kind, match.group(), match.start()))
    return out


# The parser's words for an expression that is well-formed but of the wrong type or arity:
# an ending that only gets these has mended the syntax.
_TYPE_ERROR = re.compile(
    r"expected type |argument\(s\)|number of arguments|must contain only|not allowed in binary"
    r"|unknown function"
)
_CALLED = re.compile(r"in call to (?:function )?'([a-zA-Z_]\w*)'")


def _parses(text: str) -> bool:
    try:
        pp.parse(text)
    except ValueError as exc:
        return _TYPE_ERROR.search(str(exc)) is not None
    return True


def _open_brackets(prefix: list[Token]) -> list[str] | None:
    """The brackets still open after `prefix`, innermost last; None when one is closed by
    the wrong kind (no ending mends that)."""
    stack: list[str] = []
    for token in prefix:
        if token.text in _CLOSES:
            stack.append(token.text)
        elif token.text in (")", "]", "}") and (not stack or _CLOSES[stack.pop()] != token.text):
            return None
    return stack


def _completes(text: str, prefix: list[Token], parses: Callable[[str], bool]) -> bool:
    stack = _open_brackets(prefix)
    if stack is None:
        return False
    head = text[: prefix[-1].end]
    fillers = _FILLERS[stack[-1] if stack else "("]
    closers = [_CLOSES[b] for b in reversed(stack)]
    # An operand may be wanted after the innermost bracket closes (`on(x)` wants its right
    # side) or after the last.
    endings = {f"{closers[0]}{tail}{''.join(closers[1:])}" for tail in _TAILS} if closers else set()
    endings |= {"".join(closers) + tail for tail in _TAILS}
    endings |= {tail + "".join(closers) for tail in _TAILS}  # `without (x)` wants its operand
    return any(parses(f"{head}{filler}{ending}") for filler in fillers for ending in endings)


class _TooHardError(Exception):
    """The expression is past what the search may spend on it."""


def _depth(found: list[Token]) -> int:
    depth = deepest = 0
    for token in found:
        if token.text in _CLOSES:
            depth += 1
            deepest = max(deepest, depth)
        elif token.text in (")", "]", "}"):
            depth = max(0, depth - 1)
    return deepest


def culprit(text: str, found: list[Token]) -> Token | None:
    """The first of `text`'s tokens no ending makes valid; None when the input ended too
    soon. Raises _TooHardError past MAX_DEPTH brackets or MAX_PARSES parses."""
    if _depth(found) > MAX_DEPTH:
        raise _TooHardError
    left = [MAX_PARSES]

    def parses(candidate: str) -> bool:
        left[0] -= 1
        if left[0] < 0:
            raise _TooHardError
        return _parses(candidate)

    # A prefix no ending completes stays so however it goes on: the first is found by
    # bisection, a few dozen parses for a long expression.
    low, high = 0, len(found)  # every prefix shorter than `low` tokens completes
    while low < high:
        middle = (low + high) // 2
        if _completes(text, found[: middle + 1], parses):
            low = middle + 1
        else:
            high = middle
    return found[low] if low < len(found) else None


def position(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of `offset` in `text`."""
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def located(text: str, message: str) -> str:
    """The parser's `message` about `text` as promtool gives it: `LINE:COL: parse error: ...`,
    naming what was found where the parser's own words say no more than that it failed."""
    if len(text) > MAX_LOCATED_CHARS:
        return f"parse error: {message}"
    found = tokens(text)
    at = _named(text, found, message)
    if at is not None:
        line, column = position(text, at)
        return f"{line}:{column}: parse error: {message}"
    try:
        token = culprit(text, found)
    except _TooHardError:
        return f"parse error: {message}"
    if token is None:
        line, column = position(text, len(text))
        said = "unexpected end of input" if _generic(message) else message
    elif token.text == ")" and _stray(found, token):
        # A parenthesis closing nothing: the lexer, in Prometheus, stops after it.
        line, column = position(text, token.end)
        said = message
    else:
        line, column = position(text, token.start)
        specific = not _generic(message) and not message.startswith("unclosed left")
        said = message if specific else f"unexpected {token.described()}"
    return f"{line}:{column}: parse error: {said}"


def _named(text: str, found: list[Token], message: str) -> int | None:
    """Where the thing a message about sound syntax names starts, as Prometheus places it: a
    call of the wrong arity at its name, an argument of the wrong type at the argument, a
    bad regular expression at its matcher, a bad value or unknown name where it is written."""
    if "must contain only scalar and instant vector" in message:
        return _range_operand(found)
    quoted = re.search(r"^unknown function with name '([^']+)'$|duration syntax: (\S+)$", message)
    if quoted:
        value = quoted.group(1) or quoted.group(2)
        starts = [t.start for t in found if t.text == value] or (
            [text.find(value)] if value in text else []
        )
        return starts[0] if starts else None
    if _TYPE_ERROR.search(message):
        called = _CALLED.search(message)
        name = next((i for i, t in enumerate(found) if called and t.text == called.group(1)), None)
        if "expected type" not in message:
            return found[name].start if name is not None else 0
        opening = next(
            (i for i, t in enumerate(found) if t.text == "(" and (name is None or i > name)), None
        )
        return found[opening + 1].start if opening is not None and opening + 1 < len(found) else 0
    if message.startswith("illegal regex for "):
        regex = message.removeprefix("illegal regex for ")
        for i, t in enumerate(found):
            if t.kind == "string" and t.text[1:-1] == regex and i >= 2:
                return found[i - 2].start  # the label the matcher is on
    return None


def _range_operand(found: list[Token]) -> int:
    """The first range selector on a side of a binary operator: `x[5m]` in `1 + x[5m]`."""
    for i, token in enumerate(found):
        if token.text != "[" or i == 0:
            continue
        j = i - 1
        if found[j].text == "}":  # back over the matchers
            while j > 0 and found[j].text != "{":
                j -= 1
            j -= 1
        if j >= 0 and found[j].kind == "identifier":
            before = found[j - 1] if j > 0 else None
            if before is None or (before.kind == "operator" and before.text not in "(,{["):
                return found[j].start
    return 0


def _stray(found: list[Token], token: Token) -> bool:
    """Whether `token` closes a bracket that was never opened."""
    before = [t for t in found if t.start < token.start]
    return _open_brackets(before) == []


def _generic(message: str) -> bool:
    return message in ("invalid promql query", "")
