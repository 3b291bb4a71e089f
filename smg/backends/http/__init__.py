"""HTTP workers that implement the Messages API themselves: validate, relay, re-shape errors."""
