"""SQLite database backend with a writer queue (see base.py)."""
