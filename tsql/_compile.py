"""The checks SQL Server makes when it compiles a batch, before anything runs.

Variables are resolved in text order: a reference to a variable not declared earlier
in the batch (or procedure) is Msg 137, a second DECLARE of one is Msg 134, BREAK or
CONTINUE outside WHILE is Msg 135, CREATE PROCEDURE after another statement is Msg
111. The declarations found are what the frame creates when the batch starts (see
_frame).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields, is_dataclass

from . import _ast as ast
from ._errors import SYNTAX_LEVEL, SqlError
from ._types import SqlType


@dataclass(frozen=True, slots=True)
class Declared:
    key: str
    name: str
    type: SqlType | None  # None: a table variable
    columns: tuple[tuple[str, SqlType], ...] = ()
    constraints: ast.TableConstraints = ast.NO_CONSTRAINTS


def check(
    statements: list[ast.Statement], parameters: list[ast.Parameter] | None = None
) -> list[Declared]:
    """The batch's declarations, in text order, after SQL Server's compile-time checks.

    Raises:
        SqlError: 137, 134, 135 or 111, on the line of the statement at fault.
    """
    declared: dict[str, Declared] = {}
    for parameter in parameters or ():
        declared[parameter.key] = Declared(parameter.key, parameter.name, parameter.type)
    for index, statement in enumerate(statements):
        if isinstance(statement, ast.CreateProcedure) and index > 0:
            raise SqlError(
                111,
                f"'{'ALTER' if statement.alter else 'CREATE'} PROCEDURE' must be the first"
                " statement in a query batch.",
                level=SYNTAX_LEVEL,
                line=statement.line,
            )
        _statement(statement, declared, loops=0)
    return list(declared.values())[len(parameters or ()) :]


def _statement(node: ast.Statement, declared: dict[str, Declared], loops: int) -> None:
    if isinstance(node, ast.CreateProcedure):
        return  # its body is checked when it runs, with its parameters
    if isinstance(node, ast.Declare):
        for item in node.items:
            if item.init is not None:
                _references(item.init, declared, node.line)
            if item.key in declared:
                raise SqlError(
                    134,
                    f"The variable name '{item.name}' has already been declared. Variable names"
                    " must be unique within a query batch or stored procedure.",
                    level=SYNTAX_LEVEL,
                    line=node.line,
                )
            declared[item.key] = Declared(
                item.key, item.name, item.type, item.columns, item.constraints
            )
        return
    if isinstance(node, (ast.Break, ast.Continue)) and loops == 0:
        word = "BREAK" if isinstance(node, ast.Break) else "CONTINUE"
        raise SqlError(
            135,
            f"Cannot use a {word} statement outside the scope of a WHILE statement.",
            level=SYNTAX_LEVEL,
            line=node.line,
        )
    for key, name in _targets(node):
        if key not in declared:
            raise _undeclared(name, node.line)
    inner_loops = loops + 1 if isinstance(node, ast.While) else loops
    for child in _children(node):
        if isinstance(child, ast.Statement):
            _statement(child, declared, inner_loops)
        else:
            _references(child, declared, node.line)


def _undeclared(name: str, line: int) -> SqlError:
    return SqlError(
        137, f'Must declare the scalar variable "{name}".', level=SYNTAX_LEVEL, line=line
    )


def _targets(node: ast.Statement) -> list[tuple[str, str]]:
    """The variables a statement writes, named by key (not by an expression)."""
    if isinstance(node, ast.SetVariable):
        return [(node.key, node.name)]
    if isinstance(node, ast.BeginDialog):
        return [(node.handle, node.handle_name)]
    if isinstance(node, ast.Receive):
        found = [(node.into, node.into)] if node.into else []
        if node.group_variable:
            found.append((node.group_variable, node.group_variable_name or node.group_variable))
        return found
    if isinstance(node, ast.Execute) and node.result:
        return [(node.result, node.result)]
    return []


def _children(node: object) -> Iterator[object]:
    for f in fields(node):  # type: ignore[arg-type]
        value = getattr(node, f.name)
        if isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, tuple):
                    yield from item
                else:
                    yield item
        elif value is not None and not isinstance(value, (str, int, bool, dict)):
            yield value


def _references(node: object, declared: dict[str, Declared], line: int) -> None:
    if isinstance(node, ast.Variable):
        if node.key not in declared:
            raise _undeclared(node.name, line)
        return
    if isinstance(node, ast.Select):
        for item in node.items:
            _references(item, declared, line)
        return
    if isinstance(node, ast.SelectItem):
        if node.target is not None and node.target not in declared:
            raise _undeclared(node.target_name or node.target, line)
        _references(node.expr, declared, line)
        return
    if isinstance(node, ast.Argument):
        if node.expr is not None:
            _references(node.expr, declared, line)
        return
    if is_dataclass(node) and isinstance(node, ast.Expr):
        for child in _children(node):
            _references(child, declared, line)
