"""The run engine: pure Python, no Django. See docs/engine.md."""
