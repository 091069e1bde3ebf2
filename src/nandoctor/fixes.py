"""Concrete fixes: rewrite the user's own line with a guard where the op can be found in it.

A guard is named once here, with the Python source that applies it (`GUARDS`). The rewritten
line the report shows and the re-run that verifies it (instrument/remedies.py, which evaluates
the same source) use the same guard on the same operands: every call of the op on that line.
"""

from __future__ import annotations

import ast

from nandoctor.instrument.precision import REDUCED_DTYPES

EPS = "1e-12"

# Guard name -> the source that keeps an operand `{x}` inside the op's domain.
GUARDS = {
    "positive": "{x}.clamp_min(1e-12)",
    "above_minus_one": "{x}.clamp_min(-1 + 1e-7)",
    "inside_unit": "{x}.clamp(-1 + 1e-7, 1 - 1e-7)",
    "exp_range": "{x}.clamp(max=80.0)",  # exp(80) = 5.5e34: inside float32 and bfloat16
    "exp_range_half": "{x}.clamp(max=10.0)",  # exp(10) = 22026: inside float16
    # a denominator that may be negative keeps its sign; only values at zero move
    "away_from_zero": "torch.where({x}.abs() < 1e-12, 1e-12, {x})",
    # float16 rounds 1e-12 to 0 (its smallest positive value is 6e-8, its smallest normal 6e-5),
    # and float16 and bfloat16 both round 1 - 1e-7 to 1: their guards use bounds they can hold
    "positive_half": "{x}.clamp_min(1e-4)",
    "away_from_zero_half": "torch.where({x}.abs() < 1e-4, 1e-4, {x})",
    "above_minus_one_reduced": "{x}.clamp_min(-1 + 1e-2)",
    "inside_unit_reduced": "{x}.clamp(-1 + 1e-2, 1 - 1e-2)",
}

# The Python-level callables (by name) that run each guardable op, and the argument a guard
# acts on when the function is called as `torch.f(...)` (as a method, `x.f()`, a unary op's
# operand is `x` and a division's is its first argument).
CALLS: dict[str, tuple[frozenset[str], int]] = {
    "log": (frozenset({"log", "log_"}), 0),
    "log2": (frozenset({"log2", "log2_"}), 0),
    "log10": (frozenset({"log10", "log10_"}), 0),
    "log1p": (frozenset({"log1p", "log1p_"}), 0),
    "sqrt": (frozenset({"sqrt", "sqrt_"}), 0),
    "rsqrt": (frozenset({"rsqrt", "rsqrt_"}), 0),
    "reciprocal": (frozenset({"reciprocal", "reciprocal_"}), 0),
    "acos": (frozenset({"acos", "arccos", "acos_"}), 0),
    "asin": (frozenset({"asin", "arcsin", "asin_"}), 0),
    "atanh": (frozenset({"atanh", "arctanh"}), 0),
    "exp": (frozenset({"exp", "exp_"}), 0),
    "expm1": (frozenset({"expm1"}), 0),
    "pow": (frozenset({"pow", "__pow__", "pow_"}), 0),
    "div": (frozenset({"div", "divide", "true_divide", "__truediv__", "__itruediv__", "div_"}), 1),
}
# Ops whose operand a re-run can keep inside the domain at the located line (a `guard_op`
# remedy, applied by instrument/remedies.py).
GUARDABLE_OPS = frozenset(CALLS)
_BINARY = {"div": ast.Div, "pow": ast.Pow}  # ops written as operators: `a / b`, `x ** p`
# A name, attribute, subscript or call binds tighter than `.method()`: no parentheses needed.
_ATOMS = (ast.Name, ast.Attribute, ast.Subscript, ast.Call)


def guard_for(op: str, dtype: str | None = None, signed: bool = False) -> str:
    """The guard for `op`'s operand. `dtype`: what the op computed in; `signed`: the operand
    held negative values (a denominator that is a difference, not a norm or a count)."""
    reduced = "_reduced" if dtype in REDUCED_DTYPES else ""
    half = "_half" if dtype == "float16" else ""
    if op == "log1p":
        return "above_minus_one" + reduced
    if op in ("acos", "asin", "atanh"):
        return "inside_unit" + reduced
    if op in ("exp", "expm1"):
        return "exp_range" + half
    if op in ("div", "reciprocal") and signed:
        return "away_from_zero" + half
    return "positive" + half


def guard_remedy(op: str, guard: str, file: str, line: int, code: str | None) -> dict:
    """The `guard_op` remedy: every call of `op` at file:line guarded with `guard`. `shown`:
    that line rewritten the same way, the fix the report shows (None when it cannot be)."""
    shown = guarded_line(code, op, guard) if code else None
    return {"kind": "guard_op", "op": op, "guard": guard, "file": file, "line": line,
            "shown": shown}  # fmt: skip


def guarded_line(code: str, op: str, guard: str) -> str | None:
    """`code` with the operand of every call of `op` guarded, as the re-run guards it:
    `torch.log(p)` -> `torch.log(p.clamp_min(1e-12))`, `a / b` -> `a / b.clamp_min(1e-12)`.
    None when the line does not parse or holds no such call."""
    parsed = _parse_line(code.strip())
    if parsed is None or op not in CALLS:
        return None
    tree, text = parsed[0], parsed[1]
    operands = _outermost([found for node in ast.walk(tree) if (found := _operand(node, op))])
    if not operands:
        return None
    edits = []
    for node in operands:
        segment = text[node.col_offset : node.end_col_offset]
        source = segment if isinstance(node, _ATOMS) else f"({segment})"
        edits.append((node, GUARDS[guard].format(x=source)))
    return _rewritten(parsed, edits)


def _rewritten(parsed: tuple, edits: list[tuple[ast.AST, str]]) -> str:
    """The line `_parse_line` parsed, with each node's source replaced (the nodes do not
    overlap), and the text around the parsed part put back."""
    _, text, before, after = parsed
    for node, replacement in sorted(edits, key=lambda e: e[0].col_offset, reverse=True):
        text = text[: node.col_offset] + replacement + text[node.end_col_offset :]
    return before + text.removesuffix(_BODY) + after


def _operand(node: ast.AST, op: str) -> ast.AST | None:
    if op in _BINARY and isinstance(node, ast.BinOp) and isinstance(node.op, _BINARY[op]):
        return node.right if op == "div" else node.left
    if not isinstance(node, ast.Call) or _function_name(node) not in CALLS[op][0]:
        return None
    position = CALLS[op][1]
    if isinstance(node.func, ast.Attribute) and not _is_module(node.func.value):
        # a method: `x.log()` guards x, `a.div(b)` guards b
        return node.args[0] if position == 1 and node.args else node.func.value
    return node.args[position] if len(node.args) > position else None


def _is_module(node: ast.AST) -> bool:
    """`torch`, `torch.special`, `F`, `np`: a function namespace rather than a tensor."""
    return isinstance(node, ast.Name) and node.id in ("torch", "F", "np", "math") or (
        isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id == "torch"
    )  # fmt: skip


def _outermost(nodes: list[ast.AST]) -> list[ast.AST]:
    """Operands not inside another one (`log(log(x))` rewrites the outer call's operand)."""
    spans = [(n.col_offset, n.end_col_offset) for n in nodes]
    return [
        n for n, (start, end) in zip(nodes, spans, strict=True)
        if not any(s <= start and end <= e and (s, e) != (start, end) for s, e in spans)
    ]  # fmt: skip


def _function_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


_BODY = " pass"  # makes `if x:` or `for ...:` parse alone


def _parse_line(text: str) -> tuple[ast.AST, str, str, str] | None:
    """(tree, the text parsed, the line's text before it, the line's text after it): the whole
    line, a block header given a body, or for a line that does not parse alone (a call
    continued below) its expression part."""
    expression = text.rstrip(":,\\(").split("=", 1)[-1].strip()
    start = text.find(expression)
    candidates = (
        (text, "", ""),
        (text + _BODY, "", ""),
        (expression, text[:start], text[start + len(expression) :]),
    )
    for candidate, before, after in candidates:
        try:
            return ast.parse(candidate), candidate, before, after
        except SyntaxError:
            continue
    return None


# A clamp's bound moved strictly inside the next op's domain, as written in a fix and as a
# re-run applies it: (bound, side, reduced precision) -> the new bound's source.
_INSIDE_BOUNDS = {
    (0.0, "min", False): "1e-12", (0.0, "min", True): "1e-4",
    (1.0, "max", False): "1 - 1e-7", (1.0, "max", True): "1 - 1e-2",
    (-1.0, "min", False): "-1 + 1e-7", (-1.0, "min", True): "-1 + 1e-2",
}  # fmt: skip
CLAMPS = frozenset({"clamp", "clip", "clamp_", "clip_", "clamp_min", "clamp_min_",
                     "clamp_max", "clamp_max_"})  # fmt: skip


def inside_bound(bound: float, side: str, dtype: str | None) -> str | None:
    """The source of a bound just inside the domain, for a clamp whose `side` bound is `bound`
    (None for a bound this table does not move)."""
    return _INSIDE_BOUNDS.get((float(bound), side, dtype in REDUCED_DTYPES))


def bound_remedy(file: str, line: int, code: str | None, bounds: list[dict],
                 dtype: str | None) -> dict | None:  # fmt: skip
    """The `move_bound` remedy: each of `bounds` ({"side", "bound"}) of the clamps at
    file:line moved just inside the domain. `shown`: the line rewritten the same way."""
    moved = [{**b, "to": inside} for b in bounds
             if (inside := inside_bound(b["bound"], b["side"], dtype)) is not None]  # fmt: skip
    if not moved:
        return None
    shown = moved_bound_line(code, moved) if code else None
    return {"kind": "move_bound", "file": file, "line": line, "bounds": moved, "shown": shown}


def moved_bound_line(code: str, moved: list[dict]) -> str | None:
    """`cos = torch.clamp(cos, -1.0, 1.0)` with each bound of `moved` ({"side", "bound",
    "to"}) written as its "to"; None when the line writes none of them as a number."""
    parsed = _parse_line(code.strip())
    if parsed is None:
        return None
    edits = [(node, b["to"]) for call in ast.walk(parsed[0])
             if isinstance(call, ast.Call) and _function_name(call) in CLAMPS
             for b in moved
             if (node := _bound_argument(call, b["side"])) is not None
             and _number(node) == b["bound"]]  # fmt: skip
    return _rewritten(parsed, edits) if edits else None


def _bound_argument(call: ast.Call, side: str) -> ast.AST | None:
    """The argument of a clamp call that gives its `side` ("min" or "max") bound."""
    for keyword in call.keywords:
        if keyword.arg == side:
            return keyword.value
    name = (_function_name(call) or "").rstrip("_")
    as_method = isinstance(call.func, ast.Attribute) and not _is_module(call.func.value)
    first = 0 if as_method else 1  # torch.clamp(x, lo, hi) against x.clamp(lo, hi)
    if name in ("clamp_min", "clamp_max"):
        wanted = first if name == f"clamp_{side}" else None
    else:
        wanted = first + (0 if side == "min" else 1)
    return call.args[wanted] if wanted is not None and len(call.args) > wanted else None


def _number(node: ast.AST) -> float | None:
    """The value of a written number (`1.0`, `-1`, `0.`), or None."""
    sign = 1.0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1.0, node.operand
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):  # fmt: skip
        return sign * float(node.value)
    return None


# Sample statistics whose Bessel correction divides by n - 1: 0/0 for a single value.
SAMPLE_STATISTICS = frozenset({"std", "var", "std_mean", "var_mean"})
_CORRECTION_KEYWORDS = ("unbiased", "correction")


def population_statistics_remedy(file: str, line: int, code: str | None) -> dict:
    """The `population_statistics` remedy: the std/var calls at file:line computed without
    the n - 1 correction, finite for a single value. `shown`: the line rewritten the same way."""
    shown = population_statistics_line(code) if code else None
    return {"kind": "population_statistics", "file": file, "line": line, "shown": shown}


def population_statistics_line(code: str) -> str | None:
    """`adv.std()` -> `adv.std(correction=0)` for every std/var call on the line; None when
    there is none, or one passes its correction by position."""
    parsed = _parse_line(code.strip())
    if parsed is None:
        return None
    tree, text = parsed[0], parsed[1]
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _function_name(node) in SAMPLE_STATISTICS]  # fmt: skip
    if not calls or any(_correction_by_position(call) for call in calls):
        return None
    if len(_outermost(calls)) != len(calls):
        return None  # `torch.std(x.var())`: a rewrite of the outer call would drop the inner's
    edits = []
    for call in calls:
        # the callee and the arguments keep their own text; the correction is written last
        callee = text[call.col_offset : call.func.end_col_offset]
        arguments = [ast.get_source_segment(text, a) for a in call.args]
        arguments += [f"{k.arg}={ast.get_source_segment(text, k.value)}" if k.arg
                      else f"**{ast.get_source_segment(text, k.value)}"
                      for k in call.keywords if k.arg not in _CORRECTION_KEYWORDS]  # fmt: skip
        edits.append((call, f"{callee}({', '.join([*arguments, 'correction=0'])})"))
    return _rewritten(parsed, edits)


def _correction_by_position(call: ast.Call) -> bool:
    """`x.std(0, True)` / `torch.std(x, 0, True)`: a bool among the positional arguments."""
    return any(isinstance(a, ast.Constant) and isinstance(a.value, bool) for a in call.args)


# Functions that write a constant into a tensor: a mask's -inf goes in through one of them.
FILLS = frozenset({"masked_fill", "masked_fill_", "where", "full", "full_like", "new_full",
                   "fill_", "fill"})  # fmt: skip
_INF_NAMES = ("inf", "infinity")


def finite_fill_remedy(file: str, line: int, code: str | None) -> dict:
    """The `finite_fill` remedy: the infinite constants the line's fills write become the
    most extreme finite values of their dtype. `shown`: the line rewritten the same way."""
    shown = finite_fill_line(code) if code else None
    return {"kind": "finite_fill", "file": file, "line": line, "shown": shown}


def finite_fill_line(code: str) -> str | None:
    """`scores.masked_fill(mask, float("-inf"))` ->
    `scores.masked_fill(mask, torch.finfo(scores.dtype).min)`: a row whose every entry is
    masked then softmaxes to equal weights instead of 0/0. None unless the line fills a tensor
    it names with a written infinity."""
    parsed = _parse_line(code.strip())
    if parsed is None:
        return None
    tree, text = parsed[0], parsed[1]
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _function_name(node) in FILLS):
            continue
        filled = _filled_tensor(node)
        for value in (*node.args, *(k.value for k in node.keywords)):
            sign = _written_infinity(value)
            if sign and filled is not None:
                dtype = f"{text[filled.col_offset : filled.end_col_offset]}.dtype"
                extreme = "min" if sign < 0 else "max"
                edits.append((value, f"torch.finfo({dtype}).{extreme}"))
    return _rewritten(parsed, edits) if edits else None


def _filled_tensor(call: ast.Call) -> ast.AST | None:
    """The tensor whose dtype the fill writes in: `x` of `x.masked_fill(...)` or of
    `torch.masked_fill(x, ...)`, the kept values of `torch.where(mask, x, -inf)`."""
    name = _function_name(call)
    if isinstance(call.func, ast.Attribute) and not _is_module(call.func.value):
        return call.func.value
    if name == "where" and len(call.args) == 3:
        return next((a for a in call.args[1:] if not _written_infinity(a)), None)
    return call.args[0] if name in ("masked_fill", "full_like") and call.args else None


def _written_infinity(node: ast.AST) -> int:
    """-1 for a written -inf (`float("-inf")`, `-float("inf")`, `-math.inf`, `-torch.inf`),
    +1 for +inf, 0 for anything else."""
    sign = 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        sign, node = -1, node.operand
    if isinstance(node, ast.Attribute) and node.attr in _INF_NAMES:
        return sign
    if (isinstance(node, ast.Call) and _function_name(node) == "float" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):  # fmt: skip
        word = node.args[0].value.strip().lower()
        if word.lstrip("+-") in _INF_NAMES:
            return -sign if word.startswith("-") else sign
    return 0
