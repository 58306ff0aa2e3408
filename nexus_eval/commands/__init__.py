"""One module per area; each exposes `register(app)`."""
