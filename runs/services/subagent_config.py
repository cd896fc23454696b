"""Checks of a version's `subagents` (agents as tools), each problem named by
the field: a slug the tenant has no agent for, an agent that lists itself, or a
list that closes a cycle through the sub-agents' own current versions."""

from __future__ import annotations

from typing import Any

from controlplane.models import Tenant
from runs.models import Agent
from runs.tools.subagents import (
    MAX_DESCRIPTION_CHARS,
    MAX_TOOL_NAME_CHARS,
    subagent_entries,
    subagent_tool_name,
)

MAX_SUBAGENTS = 50


def subagents_problems(
    *, tenant: Tenant, agent_slug: str, value: Any
) -> tuple[list[dict[str, str]], list[str]]:
    """The entries to store and what is wrong with them ([] when nothing).
    `agent_slug`: the agent being saved ("" when not known: no cycle check)."""
    if not isinstance(value, list):
        return [], ["must be a list of agent slugs or {agent, description} objects"]
    problems: list[str] = []
    for index, item in enumerate(value):
        if isinstance(item, dict):
            unknown = sorted(set(item) - {"agent", "description"})
            if unknown:
                problems.append(f"subagents[{index}]: unknown keys {unknown}")
            if not isinstance(item.get("agent"), str):
                problems.append(f"subagents[{index}].agent must be an agent slug")
            description = item.get("description", "")
            if not isinstance(description, str):
                problems.append(f"subagents[{index}].description must be a string")
            elif len(description) > MAX_DESCRIPTION_CHARS:
                problems.append(
                    f"subagents[{index}].description has {len(description)} "
                    f"characters; at most {MAX_DESCRIPTION_CHARS}"
                )
        elif not isinstance(item, str):
            problems.append(f"subagents[{index}] must be a slug or an object")
    if len(value) > MAX_SUBAGENTS:
        problems.append(f"has {len(value)} agents; at most {MAX_SUBAGENTS}")
    if problems:
        return [], problems
    entries = subagent_entries(value)
    slugs = [entry["agent"] for entry in entries]
    if len(set(slugs)) != len(slugs):
        problems.append("lists an agent twice")
    if agent_slug and agent_slug in slugs:
        problems.append(f"agent {agent_slug!r} may not list itself as a sub-agent")
    for slug in slugs:
        try:
            _tool_name_fits(slug)
        except ValueError as exc:
            problems.append(str(exc))
    graph = _subagent_graph(tenant)
    unknown = [slug for slug in slugs if slug not in graph]
    if unknown:
        problems.append(f"no agent {', '.join(map(repr, unknown))} in this tenant")
    if agent_slug and not problems:
        cycle = _cycle_through(graph, agent_slug, slugs)
        if cycle:
            problems.append(
                "a cycle: " + " -> ".join(cycle) + " (an agent may not reach "
                "itself through its sub-agents)"
            )
    return entries, problems


def _tool_name_fits(slug: str) -> None:
    if len(subagent_tool_name(slug)) > MAX_TOOL_NAME_CHARS:
        raise ValueError(
            f"agent {slug!r}: its tool name {subagent_tool_name(slug)!r} is over "
            "64 characters; give the agent a shorter slug"
        )


def _subagent_graph(tenant: Tenant) -> dict[str, list[str]]:
    """Each live agent of the tenant -> the slugs its current version lists."""
    rows = Agent.objects.filter(tenant=tenant, deleted_at__isnull=True).values_list(
        "slug", "current_version__subagents"
    )
    return {
        slug: [entry["agent"] for entry in subagent_entries(subs or [])]
        for slug, subs in rows
    }


def _cycle_through(
    graph: dict[str, list[str]], start: str, first: list[str]
) -> list[str] | None:
    """A path start -> ... -> start through the new list, or None."""
    stack: list[tuple[str, list[str]]] = [(slug, [start, slug]) for slug in first]
    seen: set[str] = set()
    while stack:
        slug, path = stack.pop()
        if slug == start:
            return path
        if slug in seen:
            continue
        seen.add(slug)
        for nxt in graph.get(slug, []):
            stack.append((nxt, [*path, nxt]))
    return None
