"""The Anthropic Messages API as data: request, response and stream-event models, validation
rules and error values. Nothing here knows about HTTP servers, workers or the journal."""
