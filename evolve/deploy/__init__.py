"""Choosing the program to deploy, in one place: a run's front cross-validated (front_cv.py: what
a run does at its end, and `evolve archive cv`), which CV scores rank programs against each other
(scores.py), the deployment rules that pick one (rules.py: `choose`, used by `run`, `emit-go`,
`blis-compare`, `bench --worlds`, `archive list --sort cv` and the report) and the constants a
deployed child keeps from its seed (pins.py). The archive stores the scores; this package decides
with them.

What callers use (imported on first use: choices.py, the rules' names, loads nothing)."""

from stepml_evolve.lazy import attach

__getattr__, __dir__, __all__ = attach(
    __name__,
    {
        ".choices": ("RULES", "DEFAULT_RULE", "JUDGES", "DEFAULT_JUDGE"),
        ".rules": ("Choice", "choose", "MARGIN_RULES"),
        ".scores": ("CVScores", "cv_by_program", "ranked_cv"),
        ".front_cv": ("RunFitSettings", "run_fit_settings", "cross_validate_programs", "score_front"),
        ".pins": ("pin_deployed", "deployed_program", "pins_of"),
    },
)
