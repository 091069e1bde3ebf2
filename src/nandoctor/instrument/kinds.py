"""The kinds of birth of a NaN/Inf, one meaning each: what the diagnosis decides on.

Plain strings, without torch, so the parent process can read them without importing it
(`explain.py` in the child measures which kind a birth is)."""

DOMAIN = "domain"  # an input outside the op's domain: log(0), sqrt(-1), acos(1.5), 0 ** -1
DIVISION_BY_ZERO = "division_by_zero"
OVERFLOW = "overflow"  # finite inputs, a result beyond the dtype's largest value
CONVERSION_OVERFLOW = "conversion_overflow"  # a cast to a dtype that cannot hold the value
# a constant written in the formula beyond the dtype's range: `scores * -1e9` in float16
CONSTANT_OVERFLOW = "constant_overflow"
EMPTY_REDUCTION = "empty_reduction"  # mean of no elements
TOO_FEW_ELEMENTS = "too_few_elements"  # std/var of one value
INF_ARITHMETIC = "inf_arithmetic"  # NaN made from Inf: inf - inf, 0 x inf
MASKED_SOFTMAX = "masked_softmax"  # softmax of a row that is entirely -inf
UNALIGNABLE = "unalignable"  # CTC: a sample's target needs more frames than its input has
NONFINITE_INPUT = "nonfinite_input"  # entered torch already NaN/Inf (data, numpy, a file)
NONFINITE_PARAMETER = "nonfinite_parameter"  # a parameter no watched op made non-finite
RECEIVED = "received"  # written by a collective: another rank made it
UNKNOWN = "unknown"
OVERFLOW_KINDS = (OVERFLOW, CONVERSION_OVERFLOW, CONSTANT_OVERFLOW)


def counted_kinds(counts: str) -> set[str]:
    """Which of "nan", "+inf", "-inf" a count such as "nan=2, +inf=1 of 300" holds."""
    return {kind for kind in ("nan", "+inf", "-inf") if f"{kind}=" in counts}
