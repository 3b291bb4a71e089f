"""The gateway's routes, one module per concern; each `install(app)` adds its own."""
