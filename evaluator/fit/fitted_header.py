"""The `# fitted:` header of a program file: where its constants came from, as text and back.

Two commands write fitted programs, each with its form of the header:
  * `evolve fit`: one line, `data=... seed=... scope=... group=... [restarts=N] [quick]
    train_loss=... evaluations=...` (`train_loss_all_groups=` when one fit wrote a file per group);
  * `evolve archive show --source`: two lines, `program #ID of DIR (generation G, OPERATOR)`, then
    `data=... seed=... train=... val=... test=...`.
`render()` gives the header's text, which `Program.with_constants(header=...)` writes after
`# fitted: ` on each line; `FittedHeader.parse` reads a program's source back into the fields.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stepml_evolve.evaluator.choices import DEFAULT_SEMANTICS, METHODS
from stepml_evolve.evaluator.data.prompt_reuse import DEFAULT_POLICY as DEFAULT_PROMPT_REUSE
from stepml_evolve.evaluator.data.prompt_reuse import LEGACY_POLICY
from stepml_evolve.evaluator.numbers import fmt

DEFAULT_METHOD = METHODS[0]

PREFIX = "# fitted: "
_ARCHIVED = re.compile(r"program #(\d+) of (.*) \(generation (\d+), (.*)\)")
_KEYS = (
    "data",
    "seed",
    "scope",
    "group",
    "restarts",
    "semantics",
    "prompt_reuse",
    "method",
    "objective",
    "train_loss_all_groups",
    "train_loss",
    "evaluations",
    "train",
    "val",
    "test",
)
# a key=value field, or the bare `quick` flag; values run to the next field (a data label may hold spaces)
_FIELD = re.compile(r"(?:^| )(?:(" + "|".join(_KEYS) + r")=|(quick)(?= |$))")


def header_lines(source: str) -> list[str]:
    """The text of a program's `# fitted:` lines, in order (none if it has no header)."""
    return [ln[len(PREFIX) :] for ln in source.splitlines() if ln.startswith(PREFIX)]


def _loss(x: float | None) -> str:
    return fmt(x, ".4f", keep_inf=True)


def _one_line(text) -> str:
    """A path or label as a header's comment line holds it: a line break in it (a directory may be
    named so) written as \\n, so it never ends the comment early."""
    return str(text).replace("\n", "\\n").replace("\r", "\\r")


def _number(text: str) -> float | None:
    return None if text == "n/a" else float(text)


@dataclass(frozen=True)
class FittedHeader:
    """Data and seed, then either a fit's settings (`evolve fit`) or the archived program it is (`program_id` set)."""

    data: str
    seed: int
    # evolve fit
    scope: str | None = None
    group: str | None = None
    restarts: int = 0
    quick: bool = False
    semantics: str = DEFAULT_SEMANTICS  # how the replay accounted steps (written only when not the default)
    # which requests shared prompts (--prompt-reuse; always written: a header without it was
    # written before the policy existed, when the replay shared system prompts only)
    prompt_reuse: str = DEFAULT_PROMPT_REUSE
    method: str = DEFAULT_METHOD  # the fitting method (written only when not the default)
    objective: str = "rms"  # the loss fitted: rms, worst3, with "+weights" for a weighted one (ditto)
    train_loss: float | None = None
    loss_of_all_groups: bool = False  # train_loss is the fit's loss over every group, not this file's group alone
    evaluations: int | None = None
    # evolve archive show --source
    program_id: int | None = None
    archive: str | None = None
    generation: int | None = None
    operator: str | None = None
    val_loss: float | None = None
    test_loss: float | None = None

    @property
    def origin(self) -> str:
        """The archived program: `#ID of DIR (generation G, OPERATOR)`."""
        return f"#{self.program_id} of {_one_line(self.archive)} (generation {self.generation}, {self.operator})"

    def render(self) -> str:
        if self.program_id is not None:
            return (
                f"program {self.origin}\n"
                f"data={_one_line(self.data)} seed={self.seed} prompt_reuse={self.prompt_reuse} train={_loss(self.train_loss)} "
                f"val={_loss(self.val_loss)} test={_loss(self.test_loss)}"
            )
        return (
            f"data={_one_line(self.data)} seed={self.seed} scope={self.scope} group={_one_line(self.group)}"
            + (f" restarts={self.restarts}" if self.restarts else "")
            + (" quick" if self.quick else "")
            + (f" semantics={self.semantics}" if self.semantics != DEFAULT_SEMANTICS else "")
            + f" prompt_reuse={self.prompt_reuse}"
            + (f" method={self.method}" if self.method != DEFAULT_METHOD else "")
            + (f" objective={self.objective}" if self.objective != "rms" else "")
            + f" {'train_loss_all_groups' if self.loss_of_all_groups else 'train_loss'}={_loss(self.train_loss)}"
            + f" evaluations={self.evaluations}"
        )

    def labelled(self) -> dict[str, str]:
        """The archived form as labelled fields, for a comment block (emit-go's Go file header)."""
        return {
            "program": self.origin,
            "data": _one_line(self.data),
            "seed": str(self.seed),
            "prompt reuse": self.prompt_reuse,
            "loss": f"train {_loss(self.train_loss)}, validation {_loss(self.val_loss)}, test {_loss(self.test_loss)}",
        }

    @classmethod
    def parse(cls, source: str) -> FittedHeader | None:
        """The header of a program's source; None if it has none or it is not in either form."""
        lines = header_lines(source)
        archived = _ARCHIVED.fullmatch(lines[0]) if lines else None
        fields = _fields(lines[1] if archived and len(lines) > 1 else lines[0]) if lines else {}
        if "data" not in fields or "seed" not in fields:
            return None
        try:
            if archived:
                return cls(
                    data=fields["data"],
                    seed=int(fields["seed"]),
                    program_id=int(archived[1]),
                    archive=archived[2],
                    generation=int(archived[3]),
                    operator=archived[4],
                    train_loss=_number(fields["train"]),
                    prompt_reuse=fields.get("prompt_reuse", LEGACY_POLICY),
                    val_loss=_number(fields["val"]),
                    test_loss=_number(fields["test"]),
                )
            all_groups = "train_loss_all_groups" in fields
            return cls(
                data=fields["data"],
                seed=int(fields["seed"]),
                scope=fields["scope"],
                group=fields["group"],
                restarts=int(fields.get("restarts", 0)),
                quick="quick" in fields,
                semantics=fields.get("semantics", DEFAULT_SEMANTICS),
                prompt_reuse=fields.get("prompt_reuse", LEGACY_POLICY),
                method=fields.get("method", DEFAULT_METHOD),
                objective=fields.get("objective", "rms"),
                train_loss=float(fields["train_loss_all_groups" if all_groups else "train_loss"]),
                loss_of_all_groups=all_groups,
                evaluations=int(fields["evaluations"]),
            )
        except (KeyError, ValueError):
            return None


def _fields(line: str) -> dict[str, str]:
    marks = list(_FIELD.finditer(line))
    if not marks or marks[0].start() != 0:
        return {}
    ends = [m.start() for m in marks[1:]] + [len(line)]
    return {m[1] or m[2]: line[m.end() : end] for m, end in zip(marks, ends)}
