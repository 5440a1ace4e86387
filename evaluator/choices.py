"""The names a flag of the evaluator's settings may take, and their defaults: how the replay
accounts a step, how constants are fitted and for which groups, how programs are
cross-validated, whether the physics rules apply.

The modules that act on them load numba, numexpr and pycma (replay/state.py, fit/fitting.py,
fit/crossval.py, soundness/rules.py); the names are kept here, in a module that imports nothing,
so that the command line offers them (choices, defaults, help) without loading those.
"""

# the replay's semantics: as BLIS accounts a step, or as vLLM does (replay/state.py says where they differ)
SEMANTICS = ("blis", "vllm")
DEFAULT_SEMANTICS = "blis"

SCOPES = ("global", "model", "experiment")  # a fit's constant sets: one, one per model, one per experiment
METHODS = ("trust-region", "cmaes")  # the first is the default (fitted_header.DEFAULT_METHOD)

PROTOCOLS = ("lomo", "lowo")  # and groups:FILE
GROUPS_PREFIX = "groups:"
GROUPS = "groups"  # a search's --cv groups:FILE, as its run stores it: the groups, not the file
DEFAULT_PROTOCOL = "lomo"  # `evolve archive cv --protocol` offers PROTOCOLS (the library takes groups:FILE too)

PHYSICS_MODES = (
    "check",
    "off",
)  # --physics: check (the default) applies soundness/rules.py and the floor; off: neither

# a worlds benchmark's fits of each program it scores held out (the seeds', the law's, the winner's
# alike: from its own constants, then from draws from its priors; the best train fit is scored)
HELD_OUT_FITS = 3
