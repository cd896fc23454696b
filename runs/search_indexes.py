"""The runs list's text search on PostgreSQL: trigram GIN indexes over the
expressions Django's `icontains` compares (`UPPER(<column>::text) LIKE
UPPER('%word%')`), so a search reads the index instead of every run's text.

SQLite has no such index (its LIKE scans the tenant's rows); the migration
(runs/0014) makes them on PostgreSQL only, and `bench_runs_search` measures the
search with and without them.
"""

from __future__ import annotations

RUN_SEARCH_INDEXES: dict[str, str] = {
    name: f"CREATE INDEX IF NOT EXISTS {name} ON runs_run "
    f"USING gin ((UPPER({column}::text)) gin_trgm_ops)"
    for name, column in (
        ("run_input_trgm", "input"),
        ("run_final_answer_trgm", "final_answer"),
    )
}
