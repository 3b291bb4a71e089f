"""`python -m smg` is the `smg` command."""

from smg.cli.main import main

main()
