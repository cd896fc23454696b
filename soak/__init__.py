"""The fault harness behind `make soak` (issue 24): the production topology on this
machine, demo runs with approvals and WebSocket clients, one fault at a time, and
checks against the database. `python -m soak --help` lists the options."""
