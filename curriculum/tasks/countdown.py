"""Countdown: combine some of the given numbers with + - * / to reach a target.

The reply is `<answer>EXPRESSION</answer>`, optionally preceded by one `<think>...</think>`
block, e.g. `<answer>(7 - 3) * 25 - 18</answer>` for numbers [3, 7, 18, 25] and target 82.
Each given number may be used at most once; not all have to be used. Arithmetic is exact
(fractions), so intermediate values need not be integers, but only the target counts.

Expressions are never passed to eval: `evaluate_expression` parses with
`ast.parse(mode="eval")` and walks the tree, allowing only integer constants, the four
binary operators, unary minus and parentheses, under caps on length, nodes and depth.
"""

from __future__ import annotations

import ast
import random
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from curriculum.tasks.answer_tags import (
    extract_answer,
    failed_evaluation,
    no_tag,
    only_tag_feedback,
    shorten,
)
from curriculum.tasks.base import Evaluation, Row, Task, TaskConfig


@dataclass(frozen=True)
class CountdownLevel:
    """How one difficulty level draws its numbers and hidden solution."""

    count: int  # how many numbers the prompt gives
    small_max: int  # small numbers are drawn from 1..small_max
    big: int  # how many of the numbers come from BIG_NUMBERS
    use: tuple[int, int]  # min and max numbers the hidden solution combines
    ops: str  # operators the hidden solution may use
    target: tuple[int, int]  # inclusive range of targets


BIG_NUMBERS = (25, 50, 75, 100)

LEVELS: dict[int, CountdownLevel] = {
    1: CountdownLevel(3, 9, 0, (2, 2), "+-", (2, 20)),
    2: CountdownLevel(4, 9, 0, (2, 3), "+-*", (10, 99)),
    3: CountdownLevel(4, 10, 1, (3, 3), "+-*", (20, 199)),
    4: CountdownLevel(5, 10, 1, (3, 4), "+-*/", (50, 499)),
    5: CountdownLevel(6, 10, 2, (4, 5), "+-*/", (100, 999)),
    6: CountdownLevel(6, 10, 2, (5, 6), "+-*/", (100, 999)),
}

SYSTEM_PROMPT = (
    "Reach the target number by combining some of the given numbers with +, -, *, / and "
    "parentheses. Each given number may be used at most once. Reply only with "
    "<answer>EXPRESSION</answer>, for example <answer>(7 - 3) * 25</answer>."
)

MAX_EXPRESSION_CHARS = 200
MAX_NODES = 100
MAX_DEPTH = 24
_ALLOWED_CHARS = set("0123456789+-*/() \t\n")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_OPERATOR_NAMES = {
    ast.Pow: "**", ast.Mod: "%", ast.FloorDiv: "//", ast.MatMult: "@", ast.LShift: "<<",
    ast.RShift: ">>", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
}  # fmt: skip
_TIMES = {1: "once", 2: "twice"}


# ---------------------------------------------------------------------------------------
# Config


@dataclass
class CountdownConfig(TaskConfig):
    max_expression_chars: int = MAX_EXPRESSION_CHARS
    """Longer answers are rejected before parsing (a guard against hostile input)."""

    def validate(self) -> None:
        if not isinstance(self.reveal_answer, bool):
            raise ValueError(f"reveal_answer must be True or False, got {self.reveal_answer!r}")
        limit = self.max_expression_chars
        if not isinstance(limit, int) or isinstance(limit, bool) or not 20 <= limit <= 1000:
            raise ValueError(f"max_expression_chars must be an int in 20..1000, got {limit!r}")


# ---------------------------------------------------------------------------------------
# Expression parser (the only way model output is evaluated)


@dataclass(frozen=True)
class ExpressionResult:
    """What an expression string evaluates to, or why it could not be evaluated."""

    value: Fraction | None = None
    numbers: tuple[int, ...] = ()
    """The integer constants the expression uses, in order of appearance."""
    syntax_error: str | None = None
    """Set when the text is not a parseable expression at all."""
    rule_error: str | None = None
    """Set when it parses but contains something other than integers and + - * / ( )."""
    math_error: str | None = None
    """Set when evaluation divides by zero."""


class _Rejected(Exception):
    """Raised inside the tree walk; carries the feedback sentence."""


def evaluate_expression(text: str, max_chars: int = MAX_EXPRESSION_CHARS) -> ExpressionResult:
    """Parse and exactly evaluate an integer arithmetic expression without eval.

    >>> evaluate_expression("(7 - 3) * 25").value
    Fraction(100, 1)
    """
    text = text.strip()
    if not text:
        return ExpressionResult(syntax_error="The answer is empty; write an expression.")
    if len(text) > max_chars:
        return ExpressionResult(
            syntax_error=f"The expression is {len(text)} characters long; the limit is {max_chars}."
        )
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        # ValueError covers null bytes (3.11) and lone surrogates that cannot be encoded.
        return ExpressionResult(syntax_error=_describe_syntax_error(text))
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        return ExpressionResult(rule_error=f"The expression has more than {MAX_NODES} parts.")
    constants = [n for n in nodes if isinstance(n, ast.Constant) and type(n.value) is int]
    # ast.walk is breadth-first; sort so feedback names numbers in reading order.
    constants.sort(key=lambda n: (n.lineno, n.col_offset))
    numbers = tuple(n.value for n in constants)
    try:
        _check_depth(tree.body)
        _check_elements(nodes)
    except _Rejected as rejected:
        return ExpressionResult(numbers=numbers, rule_error=str(rejected))
    try:
        value = _value(tree.body)
    except ZeroDivisionError as error:
        return ExpressionResult(numbers=numbers, math_error=str(error))
    return ExpressionResult(value=value, numbers=numbers)


def _describe_syntax_error(text: str) -> str:
    if "=" in text:
        return "Write only the expression, without '=' or a result."
    bad = next((c for c in text if c not in _ALLOWED_CHARS), None)
    if bad is not None:
        return f"The character {bad!r} is not allowed; use digits, + - * / and parentheses."
    return f"{shorten(text)!r} is not a well-formed arithmetic expression."


def _check_depth(root: ast.AST) -> None:
    # Iterative, so a hostile tree cannot exhaust the stack before the cap applies.
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _Rejected(f"The expression is nested more than {MAX_DEPTH} levels deep.")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _check_elements(nodes: list[ast.AST]) -> None:
    for node in nodes:
        if isinstance(node, ast.Expression | ast.BinOp):
            continue
        if isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise _Rejected(f"The constant {shorten(repr(node.value), 30)} is not an integer.")
        elif isinstance(node, ast.operator):
            if type(node) not in _OPERATORS:
                name = _OPERATOR_NAMES.get(type(node), type(node).__name__)
                raise _Rejected(f"The operator {name} is not allowed; use only + - * /.")
        elif isinstance(node, ast.UnaryOp | ast.USub):
            if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.USub):
                raise _Rejected("Only unary minus is allowed in front of a number.")
        elif isinstance(node, ast.Name):
            raise _Rejected(f"Names such as {shorten(node.id, 30)!r} are not allowed; use numbers.")
        elif isinstance(node, ast.Call):
            raise _Rejected("Function calls are not allowed; use only numbers and + - * /.")
        elif isinstance(node, ast.Attribute):
            raise _Rejected("Attribute access is not allowed; use only numbers and + - * /.")
        elif isinstance(node, ast.expr_context | ast.unaryop):
            # Contexts (Load) and other unary operators are reported via their parent node.
            continue
        else:
            raise _Rejected(f"{type(node).__name__} is not allowed; use only numbers and + - * /.")


def _value(node: ast.AST) -> Fraction:
    # Depth is capped by _check_depth, so recursion here is bounded.
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand)
    assert isinstance(node, ast.BinOp)
    left, right = _value(node.left), _value(node.right)
    op = _OPERATORS[type(node.op)]
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        raise ZeroDivisionError(f"It divides by zero: {shorten(ast.unparse(node.right), 30)} is 0.")
    return left / right


def _times(count: int) -> str:
    return _TIMES.get(count, f"{count} times")


def _format_value(value: Fraction) -> str:
    # Shortened: with a long max_expression_chars a value can have hundreds of digits.
    if value.denominator == 1:
        return shorten(str(value.numerator))
    return f"{shorten(str(value))} (not a whole number)"


def usage_problem(numbers: tuple[int, ...], given: list[int]) -> str | None:
    """The first way `numbers` breaks the multiset of `given` numbers, or None."""
    available = Counter(given)
    for number, used in Counter(numbers).items():
        shown = shorten(str(number))  # a long max_expression_chars allows 1000-digit numbers
        if available[number] == 0:
            return f"The number {shown} is not among the given numbers."
        if used > available[number]:
            return (
                f"The number {shown} is used {_times(used)} but given {_times(available[number])}."
            )
    return None


# ---------------------------------------------------------------------------------------
# Task


class CountdownTask(Task):
    """Reach a target from given numbers; the reply is `<answer>EXPRESSION</answer>`."""

    name = "countdown"
    config_class = CountdownConfig
    signals = ("format", "plausibility", "milestones", "correctness")

    @property
    def num_levels(self) -> int:
        return len(LEVELS)

    def _generate_one(self, level: int, rng: random.Random) -> Row:
        spec = LEVELS[level]
        low, high = spec.target
        for _ in range(200):
            numbers = [rng.randint(1, spec.small_max) for _ in range(spec.count - spec.big)]
            numbers += rng.sample(BIG_NUMBERS, spec.big)
            rng.shuffle(numbers)
            chosen = rng.sample(numbers, rng.randint(*spec.use))
            target, expression = _build_solution(chosen, spec.ops, rng)
            # A target equal to a given number is solved by writing that number alone.
            if low <= target <= high and target not in numbers:
                break
        user = f"Numbers: {', '.join(map(str, numbers))}\nTarget: {target}"
        return self.make_row(level, SYSTEM_PROMPT, user, expression, numbers=numbers, target=target)

    def reference(self, row: Row) -> str:
        return f"<answer>{row['answer']}</answer>"

    def evaluate(self, row: Row, completion: str) -> Evaluation:
        meta = self.meta(row)
        given, target = list(meta["numbers"]), int(meta["target"])
        zeros = dict.fromkeys(self.signals, 0.0)
        answer = extract_answer(completion)
        if answer is None:
            return failed_evaluation(self.signals, no_tag("EXPRESSION"))
        strict = answer.strict

        result = evaluate_expression(answer.text, self.config.max_expression_chars)
        if result.syntax_error is not None:
            return Evaluation(0.0, zeros, {
                "format": result.syntax_error,
                "plausibility": "Only the given numbers, + - * / and parentheses may appear.",
                "milestones": f"Without a valid expression there is no value to compare with {target}.",
                "correctness": f"The answer is not a valid expression, so it does not reach {target}.",
            })  # fmt: skip

        feedback: dict[str, str] = {}
        if not strict:
            feedback["format"] = only_tag_feedback("EXPRESSION")
        rule = result.rule_error or usage_problem(result.numbers, given)
        if rule is not None:
            feedback["plausibility"] = rule
        value = result.value
        if value is None:
            reason = result.math_error or "It uses something other than numbers and + - * /."
            feedback["milestones"] = f"Your expression has no value. {reason}"
            closeness = 0.0
        elif rule is not None:
            feedback["milestones"] = (
                "An expression that breaks the rules earns no closeness credit."
            )
            closeness = 0.0
        else:
            # Partial credit relative to the target's size, as in the arithmetic family;
            # exact, so a value too big for a float (a long max_expression_chars) is fine.
            gap, scale = abs(value - target), max(10, abs(target))
            closeness = 0.0 if gap >= scale else float(1 - gap / scale)
            if value != target:
                side = "below" if value < target else "above"
                feedback["milestones"] = (
                    f"{_format_value(value)} is {gap} {side} the target {target}."
                )
        correct = strict and rule is None and value == target
        if not correct:
            feedback["correctness"] = _correctness_feedback(value, target, rule)
            if self.config.reveal_answer:
                feedback["correctness"] += f" One solution is {row['answer']}."
        breakdown = {
            "format": 1.0 if strict else 0.5,
            "plausibility": 0.0 if rule is not None else 1.0,
            "milestones": closeness,
            "correctness": 1.0 if correct else 0.0,
        }
        return Evaluation(breakdown["correctness"], breakdown, feedback)


def _correctness_feedback(value: Fraction | None, target: int, rule: str | None) -> str:
    if value is None:
        return f"Your expression cannot be evaluated, so it does not reach {target}."
    if value != target:
        return f"Your expression evaluates to {_format_value(value)}, not the target {target}."
    if rule is not None:
        return f"Your expression reaches {target} but breaks a rule, so it does not count."
    return f"Your expression reaches {target}, but the reply has text outside the answer tag."


def _build_solution(numbers: list[int], ops: str, rng: random.Random) -> tuple[int, str]:
    """Combine `numbers` at random into one positive integer; return it and its expression."""
    # Each entry: (value, text, precedence of its top operator; 3 for a bare number).
    parts = [(n, str(n), 3) for n in numbers]
    while len(parts) > 1:
        i, j = rng.sample(range(len(parts)), 2)
        (a, a_text, a_prec), (b, b_text, b_prec) = parts[i], parts[j]
        if a < b:  # keep subtraction and division positive
            (a, a_text, a_prec), (b, b_text, b_prec) = (b, b_text, b_prec), (a, a_text, a_prec)
        allowed = [
            op for op in ops
            # No zero results, no exact-division failures, no trivial "* 1" or "/ 1".
            if not (op == "-" and a == b)
            and not (op == "/" and (b == 1 or a % b != 0))
            and not (op == "*" and b == 1)
        ]  # fmt: skip
        op = rng.choice(allowed or ["+"])
        value = {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a // b
        prec = _PRECEDENCE[op]
        # Parenthesise a child that binds looser, or an equal-precedence right child of - or /.
        left = f"({a_text})" if a_prec < prec else a_text
        right = f"({b_text})" if b_prec < prec or (b_prec == prec and op in "-/") else b_text
        parts = [p for k, p in enumerate(parts) if k not in (i, j)]
        parts.append((value, f"{left} {op} {right}", prec))
    return parts[0][0], parts[0][1]
