"""The tree a template parses into, each node printing as Go's parse nodes print (Go names
the action an error happened at by that text)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Node:
    pos: int


@dataclass(slots=True)
class Text(Node):
    text: str

    def __str__(self) -> str:
        return self.text


@dataclass(slots=True)
class Dot(Node):
    def __str__(self) -> str:
        return "."


@dataclass(slots=True)
class Nil(Node):
    def __str__(self) -> str:
        return "nil"


@dataclass(slots=True)
class Literal(Node):
    """A bool, string, character or number constant; `source` as written; `kind` for a
    number: int, uint, float or complex (constants.number)."""

    value: bool | str | int | float | complex
    source: str
    kind: str = ""

    @property
    def is_number(self) -> bool:
        return self.kind in ("int", "uint", "float")

    def __str__(self) -> str:
        return self.source


@dataclass(slots=True)
class Field(Node):
    names: tuple[str, ...]

    def __str__(self) -> str:
        return "".join("." + n for n in self.names)


@dataclass(slots=True)
class Variable(Node):
    name: str
    names: tuple[str, ...] = ()  # fields after the variable: $labels.job

    def __str__(self) -> str:
        return self.name + "".join("." + n for n in self.names)


@dataclass(slots=True)
class Identifier(Node):
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(slots=True)
class Chain(Node):
    """Fields after a parenthesised pipeline or a function name: (first $x).Labels."""

    node: Node
    names: tuple[str, ...]

    def __str__(self) -> str:
        inner = f"({self.node})" if isinstance(self.node, Pipe) else str(self.node)
        return inner + "".join("." + n for n in self.names)


@dataclass(slots=True)
class Command(Node):
    args: list[Node] = field(default_factory=list)

    def __str__(self) -> str:
        return " ".join(f"({a})" if isinstance(a, Pipe) else str(a) for a in self.args)


@dataclass(slots=True)
class Pipe(Node):
    decl: list[Variable] = field(default_factory=list)
    is_assign: bool = False
    cmds: list[Command] = field(default_factory=list)

    def __str__(self) -> str:
        head = ""
        if self.decl:
            head = ", ".join(str(v) for v in self.decl) + (" = " if self.is_assign else " := ")
        return head + " | ".join(str(c) for c in self.cmds)


@dataclass(slots=True)
class Action(Node):
    pipe: Pipe

    def __str__(self) -> str:
        return f"{{{{{self.pipe}}}}}"


@dataclass(slots=True)
class Branch(Node):
    """if, with and range: a pipeline, a body and an else body."""

    keyword: str
    pipe: Pipe
    body: list[Node]
    orelse: list[Node] | None

    def __str__(self) -> str:
        text = f"{{{{{self.keyword} {self.pipe}}}}}" + "".join(map(str, self.body))
        if self.orelse is not None:
            text += "{{else}}" + "".join(map(str, self.orelse))
        return text + "{{end}}"


@dataclass(slots=True)
class Loop(Node):
    keyword: str  # break or continue

    def __str__(self) -> str:
        return f"{{{{{self.keyword}}}}}"


@dataclass(slots=True)
class Call(Node):
    """{{ template "name" pipeline }}."""

    name: str
    pipe: Pipe | None

    def __str__(self) -> str:
        pipe = f" {self.pipe}" if self.pipe is not None else ""
        return f'{{{{template "{self.name}"{pipe}}}}}'


@dataclass(slots=True)
class Tree:
    root: list[Node]
    defined: dict[str, list[Node]]
