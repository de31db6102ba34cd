"""Running a parsed template as Go's text/template does: dot, variables and their scopes,
pipelines, control structures, argument type checks, and Go's error text with the line,
column and action it happened at."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuwatch.rules.template.functions import FUNCTIONS, Context, FuncError
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
from gpuwatch.rules.template.values import (
    STRUCT_FIELDS,
    ArgsMap,
    GoHTML,
    QueryResult,
    QuerySample,
    print_text,
    truth,
    type_name,
)

MAX_OUTPUT = 1 << 20  # characters one expansion may write
MAX_STEPS = 1_000_000  # nodes one expansion may run: a range over a huge query ends here
MAX_DEPTH = 100  # nested {{template}} calls


class ExecError(Exception):
    pass


class _Break(Exception):  # noqa: N818 -- {{break}} unwinding to its range, not an error
    pass


class _Continue(Exception):  # noqa: N818 -- {{continue}}, likewise
    pass


_MISSING = object()  # no value piped in (Go's missingVal)


class Executor:
    def __init__(self, tree: Tree, name: str, text: str, ctx: Context) -> None:
        self.tree = tree
        self.name = name
        self.text = text
        self.ctx = ctx
        self.vars: list[tuple[str, object]] = []
        self.node: Node | None = None
        self.out: list[str] = []
        self.size = 0
        self.steps = 0
        self.depth = 0
        self.executing = name  # the template running, a {{define}}d one inside {{template}}

    # errors
    def error(self, message: str) -> ExecError:
        name = self.name
        if self.node is None:
            return ExecError(f"template: {name}: {message}")
        pos = self.node.pos
        line = self.text.count("\n", 0, pos) + 1
        line_start = self.text.rfind("\n", 0, pos) + 1
        column = len(self.text[line_start:pos].encode())  # Go counts bytes
        return ExecError(
            f'template: {name}:{line}:{column}: executing "{self.executing}" '
            f"at <{self.node}>: {message}"
        )

    # walking
    def run(self, dot: object, variables: list[tuple[str, object]], nodes: list[Node]) -> str:
        self.vars = variables
        self.walk(dot, nodes)
        return "".join(self.out)

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise self.error(f"output over {MAX_OUTPUT} characters")
        self.out.append(text)

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise self.error(f"over {MAX_STEPS} steps")

    def walk(self, dot: object, nodes: list[Node]) -> None:
        for node in nodes:
            self.step()
            if isinstance(node, Text):
                self.write(node.text)
            elif isinstance(node, Action):
                value = self.pipeline(dot, node.pipe)
                if not node.pipe.decl:
                    self.node = node
                    self.write(print_text(value))
            elif isinstance(node, Branch):
                if node.keyword == "range":
                    self.walk_range(dot, node)
                else:
                    self.walk_if_with(dot, node)
            elif isinstance(node, Loop):
                raise _Break if node.keyword == "break" else _Continue
            elif isinstance(node, Call):
                self.walk_template(dot, node)

    def walk_if_with(self, dot: object, node: Branch) -> None:
        mark = len(self.vars)
        value = self.pipeline(dot, node.pipe)
        if truth(value):
            self.walk(value if node.keyword == "with" else dot, node.body)
        elif node.orelse is not None:
            self.walk(dot, node.orelse)
        del self.vars[mark:]

    def walk_range(self, dot: object, node: Branch) -> None:
        mark = len(self.vars)
        value = self.pipeline(dot, node.pipe)
        self.node = node
        items: Iterable[tuple[object, object]]
        if value is None:
            items = ()
        elif isinstance(value, Mapping):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            if len(node.pipe.decl) > 1:
                raise self.error(f"can't use {value} to iterate over more than one variable")
            items = ((i, i) for i in range(value))
        else:
            raise self.error(f"range can't iterate over {print_text(value)}")
        decl = node.pipe.decl
        ran = False
        for index, element in items:
            ran = True
            self.step()
            inner = len(self.vars)
            if decl:
                if node.pipe.is_assign:
                    self.set_var(decl[0].name, index if len(decl) > 1 else element)
                    if len(decl) > 1:
                        self.set_var(decl[1].name, element)
                else:
                    self.vars[-1] = (self.vars[-1][0], element)
                    if len(decl) > 1:
                        self.vars[-2] = (self.vars[-2][0], index)
            try:
                self.walk(element, node.body)
            except _Continue:
                pass
            except _Break:
                break
            finally:
                del self.vars[inner:]
        if not ran and node.orelse is not None:
            self.walk(dot, node.orelse)
        del self.vars[mark:]

    def walk_template(self, dot: object, node: Call) -> None:
        self.node = node
        body = self.tree.defined.get(node.name)
        if body is None:
            raise self.error(f'template "{node.name}" not defined')
        if self.depth >= MAX_DEPTH:
            raise self.error(f"exceeded maximum template depth ({MAX_DEPTH})")
        new_dot = self.pipeline(dot, node.pipe) if node.pipe is not None else None
        saved, self.vars = self.vars, [("$", new_dot)]
        saved_name, self.executing = self.executing, node.name
        self.depth += 1
        try:
            self.walk(new_dot, body)
        finally:
            self.depth -= 1
            self.vars, self.executing = saved, saved_name

    # variables
    def set_var(self, name: str, value: object) -> None:
        for i in range(len(self.vars) - 1, -1, -1):
            if self.vars[i][0] == name:
                self.vars[i] = (name, value)
                return
        raise self.error(f"undefined variable: {name}")

    def var_value(self, name: str) -> object:
        for var_name, value in reversed(self.vars):
            if var_name == name:
                return value
        raise self.error(f"undefined variable: {name}")

    # pipelines and commands
    def pipeline(self, dot: object, pipe: Pipe) -> object:
        self.node = pipe
        value: object = _MISSING
        for cmd in pipe.cmds:
            value = self.command(dot, cmd, value)
        for variable in pipe.decl:
            if pipe.is_assign:
                self.set_var(variable.name, value)
            else:
                self.vars.append((variable.name, value))
        return value

    def command(self, dot: object, cmd: Command, final: object) -> object:
        first = cmd.args[0]
        if isinstance(first, Variable):  # the commonest first: $labels.gpu, $value
            return self.variable(dot, first, cmd.args, final)
        if isinstance(first, Identifier):
            return self.function(dot, first, cmd, cmd.args, final)
        if isinstance(first, Field):
            self.node = first
            return self.field_chain(dot, first, first.names, cmd.args, final)
        if isinstance(first, Chain):
            return self.chain(dot, first, cmd.args, final)
        if isinstance(first, Pipe):
            self.not_a_function(cmd.args, final)
            return self.pipeline(dot, first)
        self.node = first
        self.not_a_function(cmd.args, final)
        if isinstance(first, Nil):
            raise self.error("nil is not a command")
        if isinstance(first, Dot):
            return dot
        assert isinstance(first, Literal)
        return self.constant(first)

    def not_a_function(self, args: list[Node], final: object) -> None:
        if len(args) > 1 or final is not _MISSING:
            raise self.error(f"can't give argument to non-function {_shown(args[0])}")

    def variable(self, dot: object, node: Variable, args: list[Node], final: object) -> object:
        self.node = node
        value = self.var_value(node.name)
        if not node.names:
            self.not_a_function(args, final)
            return value
        return self.field_chain(value, node, node.names, args, final)

    def chain(self, dot: object, node: Chain, args: list[Node], final: object) -> object:
        self.node = node
        receiver = self.arg(dot, "reflect", node.node)
        return self.field_chain(receiver, node, node.names, args, final)

    def field_chain(
        self,
        receiver: object,
        node: Node,
        names: tuple[str, ...],
        args: list[Node],
        final: object,
    ) -> object:
        for name in names[:-1]:
            receiver = self.field(name, node, [], _MISSING, receiver)
        return self.field(names[-1], node, args, final, receiver)

    def field(
        self, name: str, node: Node, args: list[Node], final: object, receiver: object
    ) -> object:
        # Go leaves the error position where the receiver's evaluation left it
        if receiver is None:
            return None  # Prometheus runs templates with missingkey=zero
        has_args = len(args) > 1 or final is not _MISSING
        fields = STRUCT_FIELDS.get(type(receiver))
        if fields is not None and name in fields:
            if has_args:
                raise self.error(f"{name} has arguments but cannot be invoked as function")
            return getattr(receiver, name)
        if isinstance(receiver, Mapping):
            if has_args:
                raise self.error(f"{name} is not a method but has arguments")
            return receiver.get(name, None if isinstance(receiver, ArgsMap) else "")
        raise self.error(f"can't evaluate field {name} in type {type_name(receiver)}")

    def function(
        self, dot: object, ident: Identifier, node: Node, words: list[Node] | None, final: object
    ) -> object:
        """Call the function `ident` names with the arguments after it in `words` and the
        value piped in; its errors are reported at `node`, the command, as Go reports them."""
        self.node = ident
        name = ident.name
        fn = FUNCTIONS[name]
        args = words[1:] if words else []
        given = len(args) + (final is not _MISSING)
        fixed = len(fn.params)
        if fn.variadic is not None:
            if given < fixed:
                raise self.error(
                    f"wrong number of args for {name}: want at least {fixed} got {given}"
                )
        elif given != fixed:
            raise self.error(f"wrong number of args for {name}: want {fixed} got {given}")
        if name in ("and", "or"):
            value: object = None
            for arg in args:
                value = self.arg(dot, "reflect", arg)
                if truth(value) == (name == "or"):
                    return value
            return final if final is not _MISSING else value
        argv: list[object] = []
        for i, arg in enumerate(args):
            argv.append(self.arg(dot, fn.params[i] if i < fixed else str(fn.variadic), arg))
        if final is not _MISSING:
            i = len(args)
            argv.append(self.check(final, fn.params[i] if i < fixed else str(fn.variadic)))
        if fn.needs_context:
            argv.insert(0, self.ctx)
        try:
            return fn.fn(*argv)
        except FuncError as exc:
            self.node = node
            raise self.error(f"error calling {name}: {exc}") from None

    # arguments
    def arg(self, dot: object, typ: str, node: Node) -> object:
        self.node = node
        if isinstance(node, Dot):
            return self.check(dot, typ)
        if isinstance(node, Nil):
            if typ in ("string", "float64", "bool"):
                raise self.error(f"cannot assign nil to {typ}")
            return None
        if isinstance(node, Field):
            return self.check(self.field_chain(dot, node, node.names, [node], _MISSING), typ)
        if isinstance(node, Variable):
            return self.check(self.variable(dot, node, [node], _MISSING), typ)
        if isinstance(node, Pipe):
            return self.check(self.pipeline(dot, node), typ)
        if isinstance(node, Identifier):
            return self.check(self.function(dot, node, node, None, _MISSING), typ)
        if isinstance(node, Chain):
            return self.check(self.chain(dot, node, [node], _MISSING), typ)
        assert isinstance(node, Literal)
        self.node = node
        value = node.value
        if typ in ("any", "reflect"):
            return self.constant(node)
        if typ == "string":
            if isinstance(value, str):
                return value
            raise self.error(f"expected string; found {node}")
        if typ == "float64":
            if node.is_number:
                return float(value)  # type: ignore[arg-type]
            raise self.error(f"expected float; found {node}")
        raise self.error(f"can't handle {node} for arg of type {typ}")

    def constant(self, node: Literal) -> object:
        """A constant where no type is asked for (Go's idealConstant)."""
        if node.kind == "uint":
            raise self.error(f"{node.source} overflows int")
        return node.value

    def check(self, value: object, typ: str) -> object:
        """Go's validateType: a value computed at run time against a parameter's type."""
        if typ in ("any", "reflect"):
            return value
        if value is None:
            if typ in ("string", "float64", "bool"):
                raise self.error(f"invalid value; expected {typ}")
            return None
        ok = {
            "string": isinstance(value, str) and not isinstance(value, GoHTML),
            "float64": isinstance(value, float),
            "template.queryResult": isinstance(value, QueryResult),
            "*template.sample": isinstance(value, QuerySample),
        }.get(typ, False)
        if not ok:
            raise self.error(f"wrong type for value; expected {typ}; got {type_name(value)}")
        return value


def _shown(node: Node) -> str:
    return f"({node})" if isinstance(node, Pipe) else str(node)
