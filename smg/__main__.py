"""`python -m smg` is the `smg` command."""

from smg.cli.entry import main

main()
