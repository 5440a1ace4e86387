"""The names a flag of the archive's commands may take: the keys `evolve archive list` sorts by
(browse.py) and the deployment rules of emit-go and blis-compare (deployment.py applies them).

browse.py and deployment.py load the replay's metric rows; the names are kept here, in a module
that imports nothing, so that the command line offers them without loading those.
"""

SORT_KEYS = ("id", "generation", "train", "val", "complexity", "cv")
RULES = ("best", "simplest", "lineage", "anchored", "penalized", "tethered", "guarded")  # emit-go's rules (`choose`)
# The rule emit-go, blis-compare and the worlds benchmark deploy by default: on the worlds'
# by-workload split its pick was never worse held out than the seed it descends from
# (docs/results/physics.md, "Which program a search should deploy").
DEFAULT_RULE = "guarded"
