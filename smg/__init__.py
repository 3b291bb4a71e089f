"""smg: an Anthropic Messages API gateway whose every request is an event stream."""

__version__ = "0.1.0"
