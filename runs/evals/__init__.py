"""Evaluation suites: their definitions, graders, LLM judge and YAML files
(docs/evals.md, "Suites, cases and graders")."""
