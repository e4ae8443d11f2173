"""The validation report as `colibri validate` prints it, for every format: text or JSON, Qt-free.

One line per problem, `severity: CODE at 0xOFFSET tensor 'NAME': message`, except that a run of
consecutive problems of one code and severity, each about a different tensor (a truncated file
puts every tensor after the cut beyond its end), is shown as its first line and one summary
line: 33 near-identical lines say less than two. The verdict line ends the text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import groupby

from colibri.engine import Problem

GROUP_FROM = 4   # runs this long or longer are summarised


def problem_line(p: Problem) -> str:
    tensor = f" tensor '{p.tensor}'" if p.tensor else ""
    return f"{p.severity}: {p.code_name} at 0x{p.offset:X}{tensor}: {p.message}"


def problem_lines(problems: Sequence[Problem], group_from: int = GROUP_FROM) -> list[str]:
    """The lines `colibri validate` prints for `problems`, runs summarised (see above)."""
    lines: list[str] = []
    for (severity, code, has_tensor), run in groupby(
            problems, key=lambda p: (p.severity, p.code_name, bool(p.tensor))):
        items = list(run)
        if not has_tensor or len(items) < group_from:
            lines += [problem_line(p) for p in items]
            continue
        rest = items[1:]
        lines.append(problem_line(items[0]))
        lines.append(f"  ... and {len(rest)} more {code} {severity}s like it, for tensors "
                     f"'{rest[0].tensor}' to '{rest[-1].tensor}' (table entries "
                     f"0x{rest[0].offset:X}..0x{rest[-1].offset:X}; --json lists each)")
    return lines


def validation_lines(path: str, problems: Sequence[Problem], fmt: str = "colibri") -> list[str]:
    """The text of `colibri validate`: the problem lines, then the verdict (naming the format of
    a file that is not a .colibri file)."""
    n_err = sum(p.severity == "error" for p in problems)
    kind = "" if fmt == "colibri" else f"{fmt}, "
    verdict = "INVALID" if n_err else "valid"
    return [*problem_lines(problems), f"{path}: {kind}{verdict} ({n_err} error(s), "
                                      f"{len(problems) - n_err} warning(s))"]


def validation_json(problems: Sequence[Problem], fmt: str | None, error: str = "") -> str:
    """The document of `colibri validate --json`; for a file that could not be read (`error`),
    invalid with no problems (and no format when none was recognised)."""
    if error:
        return json.dumps({"valid": False, "format": fmt, "error": error, "problems": []})
    return json.dumps({"valid": not any(p.severity == "error" for p in problems), "format": fmt,
                       "problems": [p.to_dict() for p in problems]}, indent=2)
