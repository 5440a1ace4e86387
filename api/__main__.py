"""`python -m stepml_evolve` is the `evolve` command."""

from stepml_evolve.evolve.cli import main

main()
