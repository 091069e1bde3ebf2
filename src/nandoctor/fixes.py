"""Concrete fixes: rewrite the user's own line with a guard where the op can be found in it."""

from __future__ import annotations

import ast

EPS = "1e-12"

# Ops whose input a re-run can keep inside the domain at the located line (a `guard_op`
# remedy, applied by instrument/remedies.py).
GUARDABLE_OPS = frozenset(
    {"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "acos", "asin", "atanh",
     "exp", "expm1", "pow", "div"}
)  # fmt: skip
# A name, attribute, subscript or call binds tighter than `.method()`: no parentheses needed.
_ATOMS = (ast.Name, ast.Attribute, ast.Subscript, ast.Call)


def _guarded(expression: str, guard: str, node: ast.AST | None = None) -> str:
    return f"{expression}.{guard}" if isinstance(node, _ATOMS) else f"({expression}).{guard}"


def _function_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _parse_line(code: str) -> ast.AST | None:
    try:
        return ast.parse(code.strip())
    except SyntaxError:
        # `return x` / `if x:` alone parse; a line continued elsewhere may not: try an expression
        try:
            return ast.parse(code.strip().rstrip(":,\\").split("=", 1)[-1].strip())
        except SyntaxError:
            return None


def guard_call_argument(code: str, functions: set[str], guard: str) -> str | None:
    """`torch.log(p)` -> `torch.log(p.clamp_min(1e-12))`; `p.log()` -> `p.clamp_min(1e-12).log()`."""
    text = code.strip()
    tree = _parse_line(text)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or _function_name(node) not in functions:
            continue
        if node.args:
            target = node.args[0]
        elif isinstance(node.func, ast.Attribute):
            target = node.func.value  # method call: x.log()
        else:
            continue
        segment = ast.get_source_segment(text, target)
        if segment and segment in text:
            return text.replace(segment, _guarded(segment, guard, target), 1)
    return None


def guard_denominator(code: str) -> str | None:
    """`a / b` -> `a / b.clamp_min(1e-12)` for the first division on the line."""
    text = code.strip()
    tree = _parse_line(text)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            segment = ast.get_source_segment(text, node.right)
            if segment and segment in text:
                whole = ast.get_source_segment(text, node)
                guarded = whole.replace(
                    segment, _guarded(segment, f"clamp_min({EPS})", node.right), 1
                )
                return text.replace(whole, guarded, 1)
        if isinstance(node, ast.Call) and _function_name(node) in {"div", "true_divide"}:
            if len(node.args) >= 2:
                denominator = node.args[1]
            elif node.args and isinstance(node.func, ast.Attribute):
                denominator = node.args[0]
            else:
                continue
            segment = ast.get_source_segment(text, denominator)
            if segment and segment in text:
                guarded = _guarded(segment, f"clamp_min({EPS})", denominator)
                return text.replace(segment, guarded, 1)
    return None
