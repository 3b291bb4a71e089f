"""Output parsers: text stages that turn generated text into thinking, text and tool-call pieces."""
