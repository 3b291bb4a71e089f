"""The `smg` command line: `launch`, `journal …`."""
