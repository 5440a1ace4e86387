"""The deployment rules emit-go, blis-compare and the worlds benchmark offer (rules.py applies
them), kept in a module that imports nothing so that the command line offers them without loading
the archive."""

RULES = ("best", "simplest", "lineage", "anchored", "penalized", "tethered", "guarded")  # emit-go's rules (`choose`)
# The rule emit-go, blis-compare and the worlds benchmark deploy by default: on the worlds'
# by-workload split its pick was never worse held out than the seed it descends from
# (docs/results/physics.md, "Which program a search should deploy").
DEFAULT_RULE = "guarded"
# What ranks cross-validated programs: "loss", the CV loss (the fit's objective over the held-out
# experiments: RMS APE of mean E2E + RMS APE of mean TTFT), or "e2e", the held-out mean E2E error
# (%). On the real data one overloaded run's held-out TTFT can move the CV loss 35x between fold fits
# whose train losses are within a few percent, while the mean E2E error moves 1.7x
# (docs/results/index.md, cv-starts).
JUDGES = ("loss", "e2e")
DEFAULT_JUDGE = "loss"
