"""The deployment rules emit-go, blis-compare and the worlds benchmark offer (rules.py applies
them), kept in a module that imports nothing so that the command line offers them without loading
the archive."""

RULES = ("best", "simplest", "lineage", "anchored", "penalized", "tethered", "guarded")  # emit-go's rules (`choose`)
# The rule emit-go, blis-compare and the worlds benchmark deploy by default: on the worlds'
# by-workload split its pick was never worse held out than the seed it descends from
# (docs/results/physics.md, "Which program a search should deploy").
DEFAULT_RULE = "guarded"
