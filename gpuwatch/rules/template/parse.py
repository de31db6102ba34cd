"""Go's text/template grammar: actions, pipelines and control structures into a tree.

What the parser refuses, Go refuses at parse time too (an unknown function, an undefined
variable, an `end` without its `if`), so a rule file is rejected when it loads, not when an
alert fires."""

from __future__ import annotations

from collections.abc import Container

from gpuwatch.rules.template.constants import go_quote, number, unquote
from gpuwatch.rules.template.lex import Kind, TemplateError, Token, lex
from gpuwatch.rules.template.nodes import (
    Action,
    Branch,
    Call,
    Chain,
    Command,
    Dot,
    Field,
    Identifier,
    Literal,
    Loop,
    Nil,
    Node,
    Pipe,
    Text,
    Tree,
    Variable,
)

_OPERAND_START = (
    Kind.BOOL,
    Kind.CHAR,
    Kind.DOT,
    Kind.FIELD,
    Kind.IDENT,
    Kind.NUMBER,
    Kind.NIL,
    Kind.STRING,
    Kind.VARIABLE,
    Kind.LPAREN,
)


def _item(token: Token) -> str:
    """A token as Go's parser names it in "unexpected ..." errors."""
    if token.kind is Kind.EOF:
        return "EOF"
    if token.kind in (Kind.KEYWORD, Kind.DOT, Kind.NIL):
        return f"<{token.text}>"
    if token.kind is Kind.RIGHT:
        return go_quote("}}")
    if len(token.text) > 10:
        return go_quote(token.text[:10]) + "..."
    return go_quote(token.text)


def number_literal(token: Token) -> Literal:
    """Go's constants: `80` an int, `80.0` and `1e3` floats, 'a' an int (the rune)."""
    if token.kind is Kind.CHAR:
        return Literal(token.pos, ord(unquote(token.text)), token.text, "int")
    value, kind = number(token.text)
    return Literal(token.pos, value, token.text, kind)


MAX_DEPTH = 100  # nested parentheses and control structures; Go allows 10,000


class _Parser:
    def __init__(self, text: str, name: str, functions: Container[str]) -> None:
        self.text = text
        self.name = name
        self.depth = 0
        self.tokens = lex(text)
        self.at = 0
        self.functions = functions
        self.vars: list[str] = ["$"]
        self.range_depth = 0
        self.defined: dict[str, list[Node]] = {}

    # tokens
    def peek(self) -> Token:
        return self.tokens[self.at]

    def next(self) -> Token:
        token = self.tokens[self.at]
        if token.kind is Kind.ERROR:  # the lexer stopped here; reaching it is the error
            raise TemplateError(token.text)
        self.at += 1
        return token

    def peek_non_space(self) -> Token:
        while self.tokens[self.at].kind is Kind.SPACE:
            self.at += 1
        return self.tokens[self.at]

    def next_non_space(self) -> Token:
        self.peek_non_space()
        return self.next()

    def error(self, token: Token | int, message: str) -> TemplateError:
        pos = token if isinstance(token, int) else token.pos
        line = self.text.count("\n", 0, pos) + 1
        return TemplateError(f"{line}: {message}")

    def expect(self, kind: Kind, context: str) -> Token:
        token = self.next_non_space()
        if token.kind is not kind:
            raise self.unexpected(token, context)
        return token

    def unexpected(self, token: Token, context: str) -> TemplateError:
        if token.kind is Kind.ERROR:  # the lexer's error, which carries its line
            return TemplateError(token.text)
        return self.error(token, f"unexpected {_item(token)} in {context}")

    # lists and actions
    def parse(self) -> Tree:
        root: list[Node] = []
        while self.peek().kind is not Kind.EOF:
            if self.peek().kind is Kind.LEFT and self._keyword_after_left() == "define":
                self.next()
                self.next_non_space()
                self.definition()
                continue
            node, stop = self.text_or_action()
            if stop is not None:
                raise self.error(stop, f"unexpected {{{{{stop.text}}}}}")
            if node is not None:
                root.append(node)
        if root and self.defined.get(self.name):
            raise self.error(0, f"template: multiple definition of template {go_quote(self.name)}")
        return Tree(root, self.defined)

    def _keyword_after_left(self) -> str:
        i = self.at + 1
        while self.tokens[i].kind is Kind.SPACE:
            i += 1
        return self.tokens[i].text if self.tokens[i].kind is Kind.KEYWORD else ""

    def definition(self) -> None:
        name_token = self.expect(Kind.STRING, "define clause")
        name = self.string(name_token)
        self.expect(Kind.RIGHT, "define clause")
        saved, self.vars = self.vars, ["$"]
        body, stop = self.item_list()
        self.vars = saved
        if stop.text != "end":
            raise self.error(stop, "unexpected {{else}} in define clause")
        self.define(name, body, name_token)

    def define(self, name: str, body: list[Node], token: Token) -> None:
        """As Go adds a template to its set: an empty body gives way to a full one; two full
        bodies of one name are an error."""
        existing = self.defined.get(name)
        if existing is not None and _has_content(existing):
            if _has_content(body):
                raise self.error(
                    token, f"template: multiple definition of template {go_quote(name)}"
                )
            return
        self.defined[name] = body

    def string(self, token: Token) -> str:
        try:
            return unquote(token.text)
        except TemplateError as exc:
            raise self.error(token, str(exc)) from None

    def deeper(self, token: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(token, "max expression depth exceeded")

    def item_list(self) -> tuple[list[Node], Token]:
        """Nodes up to an {{end}} or {{else}}; the keyword token is returned."""
        nodes: list[Node] = []
        while True:
            if self.peek().kind is Kind.EOF:
                raise self.error(self.peek(), "unexpected EOF")
            node, stop = self.text_or_action()
            if stop is not None:
                return nodes, stop
            if node is not None:
                nodes.append(node)

    def text_or_action(self) -> tuple[Node | None, Token | None]:
        token = self.next()
        if token.kind is Kind.TEXT:
            return Text(token.pos, token.text), None
        if token.kind is Kind.LEFT:
            return self.action()
        raise self.unexpected(token, "input")

    def action(self) -> tuple[Node | None, Token | None]:
        token = self.peek_non_space()
        if token.kind is Kind.COMMENT:
            self.next()
            self.next()
            return None, None
        if token.kind is Kind.KEYWORD:
            self.next()
            word = token.text
            if word in ("end", "else"):
                if word == "end":
                    self.expect(Kind.RIGHT, "end")
                elif self.peek_non_space().kind is not Kind.KEYWORD:
                    self.expect(Kind.RIGHT, "else")
                return None, token
            if word in ("if", "with", "range"):
                return self.control(word, token), None
            if word in ("break", "continue"):
                if not self.range_depth:
                    raise self.error(token, f"{{{{{word}}}}} outside {{{{range}}}}")
                self.expect(Kind.RIGHT, word)
                return Loop(token.pos, word), None
            if word in ("template", "block"):
                return self.template_call(word, token), None
            raise self.error(token, f"unexpected {go_quote(word)}")
        return Action(token.pos, self.pipeline("command", Kind.RIGHT)), None

    def control(self, keyword: str, token: Token) -> Branch:
        self.deeper(token)
        mark = len(self.vars)
        pipe = self.pipeline(keyword, Kind.RIGHT)
        if keyword == "range":
            self.range_depth += 1
        body, stop = self.item_list()
        if keyword == "range":
            self.range_depth -= 1
        orelse: list[Node] | None = None
        if stop.text == "else":
            follow = self.peek_non_space()
            if follow.kind is Kind.KEYWORD and follow.text in ("if", "with"):
                if follow.text != keyword or keyword == "range":
                    raise self.unexpected(follow, "else")
                self.next()
                orelse = [self.control(keyword, follow)]
            else:
                orelse, stop = self.item_list()
                if stop.text != "end":
                    raise self.error(stop, "expected end; found {{else}}")
        del self.vars[mark:]
        self.depth -= 1
        return Branch(token.pos, keyword, pipe, body, orelse)

    def template_call(self, keyword: str, token: Token) -> Node:
        name_token = self.expect(Kind.STRING, f"{keyword} clause")
        name = self.string(name_token)
        pipe: Pipe | None = None
        if keyword == "block" or self.peek_non_space().kind is not Kind.RIGHT:
            pipe = self.pipeline(f"{keyword} clause", Kind.RIGHT)  # a block needs one
        else:
            self.next()
        if keyword == "block":
            saved, self.vars = self.vars, ["$"]
            body, stop = self.item_list()
            self.vars = saved
            if stop.text != "end":
                raise self.error(stop, "unexpected {{else}} in block clause")
            self.define(name, body, name_token)
        return Call(name_token.pos, name, pipe)

    # pipelines
    def pipeline(self, context: str, end: Kind) -> Pipe:
        start = self.peek_non_space()
        pipe = Pipe(start.pos)
        self.declarations(pipe, context)
        while True:
            token = self.next_non_space()
            if token.kind is end:
                break
            if token.kind not in _OPERAND_START:
                raise self.unexpected(token, context)
            self.at -= 1
            pipe.cmds.append(self.command())
        if not pipe.cmds:
            raise self.error(token, f"missing value for {context}")
        for i, cmd in enumerate(pipe.cmds[1:], start=2):
            if isinstance(cmd.args[0], Literal | Dot | Nil):
                raise self.error(cmd.pos, f"non executable command in pipeline stage {i}")
        return pipe

    def declarations(self, pipe: Pipe, context: str) -> None:
        while self.peek_non_space().kind is Kind.VARIABLE:
            save = self.at
            variable = self.next()
            if self.peek().kind is Kind.FIELD:
                self.at = save
                return
            follow = self.peek_non_space()
            if follow.kind in (Kind.DECLARE, Kind.ASSIGN):
                self.next()
                pipe.is_assign = follow.kind is Kind.ASSIGN  # Go checks `$x =` when it runs
                pipe.decl.append(Variable(variable.pos, variable.text))
                self.vars.append(variable.text)
                return
            if follow.kind is Kind.COMMA:
                self.next()
                pipe.decl.append(Variable(variable.pos, variable.text))
                self.vars.append(variable.text)
                if context != "range" or len(pipe.decl) >= 2:
                    raise self.error(follow, f"too many declarations in {context}")
                if self.peek_non_space().kind is not Kind.VARIABLE:
                    raise self.error(follow, "range can only initialize variables")
                continue
            self.at = save
            return

    def command(self) -> Command:
        cmd = Command(self.peek_non_space().pos)
        while True:
            self.peek_non_space()
            operand = self.operand()
            if operand is not None:
                cmd.args.append(operand)
            token = self.next()
            if token.kind is Kind.SPACE:
                continue
            if token.kind in (Kind.RIGHT, Kind.RPAREN):
                self.at -= 1
            elif token.kind is not Kind.PIPE:
                raise self.unexpected(token, "operand")
            break
        if not cmd.args:
            raise self.error(cmd.pos, "empty command")
        return cmd

    def operand(self) -> Node | None:
        node = self.term()
        if node is None or self.peek().kind is not Kind.FIELD:
            return node
        names: list[str] = []
        pos = self.peek().pos  # Go places a chain at its first field, and names it there
        while self.peek().kind is Kind.FIELD:
            names.append(self.next().text[1:])
        if isinstance(node, Field):
            return Field(pos, node.names + tuple(names))
        if isinstance(node, Variable):
            return Variable(pos, node.name, node.names + tuple(names))
        if isinstance(node, Literal | Nil | Dot):
            raise self.error(node.pos, f"unexpected . after term {go_quote(str(node))}")
        return Chain(node.pos, node, tuple(names))

    def term(self) -> Node | None:
        token = self.next_non_space()
        kind = token.kind
        if kind is Kind.IDENT:
            if token.text not in self.functions:
                raise self.error(token, f"function {go_quote(token.text)} not defined")
            return Identifier(token.pos, token.text)
        if kind is Kind.DOT:
            return Dot(token.pos)
        if kind is Kind.NIL:
            return Nil(token.pos)
        if kind is Kind.VARIABLE:
            if token.text not in self.vars:
                raise self.error(token, f"undefined variable {go_quote(token.text)}")
            return Variable(token.pos, token.text)
        if kind is Kind.FIELD:
            return Field(token.pos, (token.text[1:],))
        if kind is Kind.BOOL:
            return Literal(token.pos, token.text == "true", token.text)
        if kind in (Kind.NUMBER, Kind.CHAR):
            try:
                return number_literal(token)
            except TemplateError as exc:
                raise self.error(token, str(exc)) from None
        if kind is Kind.LPAREN:
            self.deeper(token)
            pipe = self.pipeline("parenthesized pipeline", Kind.RPAREN)
            self.depth -= 1
            return pipe
        if kind is Kind.STRING:
            return Literal(token.pos, self.string(token), token.text)
        self.at -= 1
        return None


def _has_content(nodes: list[Node]) -> bool:
    """Go's IsEmptyTree is false: more than white space."""
    return any(not (isinstance(n, Text) and not n.text.strip()) for n in nodes)


def parse(text: str, name: str, functions: Container[str]) -> Tree:
    return _Parser(text, name, functions).parse()
