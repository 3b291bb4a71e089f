"""Workers, the models they serve, and which one takes the next request."""
