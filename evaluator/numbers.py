"""The one number formatter of every table, report, header and progress line ("n/a" where no number).

It lives in evaluator/ because the `# fitted:` header (evaluator/fit/fitted_header.py) needs it as
much as archive/ and evolve/ do, and dependencies point only towards evaluator/.
"""

from __future__ import annotations

import math


def finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def fmt(x, spec: str | int = 3, missing: str = "n/a", keep_inf: bool = False) -> str:
    """`x` as text, or `missing` when there is no number (None, NaN, and an infinity unless keep_inf).

    spec: a format spec (".4f", "+.3g"), or an int: that many significant digits in the report's
    compact form, where 10**spec and more print as whole numbers with thousands separators.
    """
    if not (finite(x) or (keep_inf and isinstance(x, float) and math.isinf(x))):
        return missing
    if isinstance(spec, int):
        return f"{x:,.0f}" if abs(x) >= 10**spec else f"{x:.{spec}g}"
    return format(x, spec)
