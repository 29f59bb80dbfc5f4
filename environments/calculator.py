"""`calculator`: an arithmetic tool for word problems (GSM8K, the arithmetic task).

The model may call it any number of times (up to `max_calls`) with an expression:
`<tool_call>{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}</tool_call>` or
`<tool name="calculator">12 * (3 + 4)</tool>`; it reads the result in a `tool` message and goes
on. A turn without a tool call is the final answer: the episode is done, with no reward from the
environment, so the reward service scores that answer as it scores single-turn ones (the data
set's reward, e.g. the GSM8K rule). Expressions are evaluated on numbers only (+ - * / // % **
and parentheses), never by eval.
"""
from __future__ import annotations

import ast
import math
import operator

from rlfleet.env.base import Environment, Step
from rlfleet.env.types import Action, EpisodeRow, Message, ToolCall, ToolSpec

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION = 200
MAX_MAGNITUDE = 1e15


class CalculatorError(ValueError):
    pass


def evaluate(expression: str) -> float | int:
    """The value of an arithmetic expression; CalculatorError saying why for anything else."""
    if len(expression) > MAX_EXPRESSION:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip().replace("^", "**").replace(",", ""), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> float | int:
    number = isinstance(node, ast.Constant) and type(node.value) in (int, float)  # bool is no number here
    if number:
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise CalculatorError("power too large")
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
        if isinstance(result, complex) or abs(result) > MAX_MAGNITUDE:
            raise CalculatorError("result out of range")
        return result
    raise CalculatorError(f"unsupported: {ast.unparse(node)!r} (numbers and + - * / // % ** only)")


def format_number(value: float | int) -> str:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def expression_of(call: ToolCall) -> str:
    args = call.arguments
    if isinstance(args, dict):
        value = args.get("expression", args.get("expr", ""))
        return str(value)
    return str(args)


class Calculator(Environment):
    name = "calculator"
    description = "An arithmetic calculator tool; the turn without a tool call is the final answer."
    tools = (ToolSpec("calculator", "Evaluates an arithmetic expression (+ - * / // % ** and parentheses).",
                      {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}),)

    def __init__(self, max_calls: int = 8):
        self.max_calls = max_calls

    def start(self, row: EpisodeRow) -> dict:
        return {"calls": 0}

    def step(self, state: dict, action: Action) -> Step:
        if not action.tool_calls:
            return Step(done=True)  # the final answer: the reward service scores it
        messages, errors = [], 0
        for call in action.tool_calls:
            state["calls"] += 1
            if call.name != "calculator":
                content = f"error: unknown tool {call.name!r} (the tool is 'calculator')"
                errors += 1
            elif state["calls"] > self.max_calls:
                content = f"error: no more than {self.max_calls} calculator calls per problem"
                errors += 1
            else:
                try:
                    content = format_number(evaluate(expression_of(call)))
                except CalculatorError as exc:
                    content, errors = f"error: {exc}", errors + 1
            messages.append(Message("tool", content, name="calculator"))
        return Step(observation=messages, tool_errors=errors)
