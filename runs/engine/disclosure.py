"""Progressive disclosure (spec §2.1 ch. 5, glossary §2.2): skills and tool search.

The model starts with one-line descriptions and loads more on demand:

- **Skills**: an agent version's named Markdown instructions. The system prompt
  carries only their index (name and one-line summary); `load_skill` returns a
  body when the task needs it.
- **Tool search**: a tool exposed `deferred` is not sent to the model; `tool_search`
  finds tools by name and description (BM25, top 5) and the host adds the ones
  found to the tools it sends from the next turn on (`EngineState.loaded_tools`,
  persisted with the run's checkpoint). A deferred tool called before it was
  found is refused (`not_loaded_result`) and never executed.

Pure Python: the host builds these tools and keeps the loaded set.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runs.engine.contracts import Effect, Idempotency, ToolContract, ToolSource
from runs.engine.envelope import ErrorCode, SuggestedAction, ToolResult
from runs.engine.tools import Tool, ToolContext

LOAD_SKILL = "load_skill"
TOOL_SEARCH = "tool_search"
DISCLOSURE_TOOLS = frozenset({LOAD_SKILL, TOOL_SEARCH})
TOOL_SEARCH_LIMIT = 5

MAX_SKILLS = 50
MAX_SKILL_NAME_CHARS = 64
MAX_SKILL_SUMMARY_CHARS = 200
MAX_SKILL_BODY_BYTES = 64 * 1024
SKILL_KEYS = ("name", "summary", "body")
_SKILL_NAME = re.compile(r"^[a-z0-9]+(?:[-_][a-z0-9]+)*$")
# A body is returned whole: JSON escaping of Markdown (newlines, quotes) can
# double its length in the observation.
_SKILL_OBSERVATION_CHARS = 2 * MAX_SKILL_BODY_BYTES + 4096


@dataclass(frozen=True)
class Skill:
    name: str
    summary: str
    body: str


def skills_from(value: Iterable[Mapping[str, Any]]) -> tuple[Skill, ...]:
    """Skills from a version's stored list (already validated)."""
    return tuple(
        Skill(str(s["name"]), str(s["summary"]), str(s["body"])) for s in value
    )


def skill_problems(value: Any) -> list[str]:
    """What is wrong with a version's `skills`, each naming its path
    (`skills[2].body`); empty when they may be stored."""
    if not isinstance(value, list):
        return ['must be a list of {"name", "summary", "body"} objects']
    if len(value) > MAX_SKILLS:
        return [f"has {len(value)} skills; at most {MAX_SKILLS}"]
    problems: list[str] = []
    seen: dict[str, int] = {}
    for index, skill in enumerate(value):
        where = f"skills[{index}]"
        if not isinstance(skill, dict):
            problems.append(f'{where} must be an object {{"name", "summary", "body"}}')
            continue
        for key in sorted(set(skill) - set(SKILL_KEYS)):
            problems.append(f"{where}: unknown key {key!r}; known: name, summary, body")
        for key in SKILL_KEYS:
            if not isinstance(skill.get(key), str) or not skill[key].strip():
                problems.append(f"{where}.{key} must be a non-blank string")
        name, summary, body = (skill.get(key) for key in SKILL_KEYS)
        if isinstance(name, str) and name.strip():
            if len(name) > MAX_SKILL_NAME_CHARS or not _SKILL_NAME.match(name):
                problems.append(
                    f"{where}.name must be a slug of 1-{MAX_SKILL_NAME_CHARS} "
                    "lowercase letters, digits, hyphens and underscores"
                )
            elif name in seen:
                problems.append(
                    f"{where}.name {name!r} is taken by skills[{seen[name]}]: "
                    "names must be unique"
                )
            else:
                seen[name] = index
        if isinstance(summary, str):
            if len(summary) > MAX_SKILL_SUMMARY_CHARS:
                problems.append(
                    f"{where}.summary has {len(summary)} characters; at most "
                    f"{MAX_SKILL_SUMMARY_CHARS}"
                )
            if "\n" in summary or "\r" in summary:
                problems.append(f"{where}.summary must be one line")
        if isinstance(body, str):
            size = len(body.encode("utf-8", "surrogatepass"))
            if size > MAX_SKILL_BODY_BYTES:
                problems.append(
                    f"{where}.body has {size} bytes; at most {MAX_SKILL_BODY_BYTES}"
                )
    return problems


def skill_index(skills: Sequence[Skill]) -> str:
    """The skills' one-line index for the system prompt ("" without skills)."""
    if not skills:
        return ""
    lines = [f"- {skill.name} — {skill.summary}" for skill in skills]
    return (
        f"Skills (call {LOAD_SKILL} with a skill's name to read it in full before "
        "you follow it):\n" + "\n".join(lines)
    )


def system_prompt_with_skills(system_prompt: str, skills: Sequence[Skill]) -> str:
    """The system prompt the model gets: the version's, then the skill index."""
    index = skill_index(skills)
    if not index:
        return system_prompt
    return f"{system_prompt}\n\n{index}" if system_prompt else index


def load_skill_tool(skills: Sequence[Skill]) -> Tool:
    """`load_skill`: a skill's body by name; an unknown name is an error naming
    the skills there are."""
    by_name = {skill.name: skill for skill in skills}

    def load(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        name = arguments["name"]
        skill = by_name.get(name)
        if skill is None:
            return ToolResult.failure(
                ErrorCode.EINVAL,
                f"there is no skill named {name!r}; skills: {', '.join(by_name)}",
                suggested_action=str(SuggestedAction.FIX_ARGUMENTS),
            )
        return ToolResult.success({"name": skill.name, "body": skill.body})

    contract = ToolContract(
        name=LOAD_SKILL,
        description=(
            "Read one of your skills in full: the instructions for a kind of task. "
            "The skills are listed by name in your instructions; load one when the "
            "task needs it, then follow it."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "name": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": MAX_SKILL_NAME_CHARS,
                    "description": "The skill's name, as the index lists it.",
                }
            },
            "required": ["name"],
        },
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        source=ToolSource.BUILTIN,
    )
    return Tool(
        contract,
        load,
        timeout_seconds=None,
        observation_chars=_SKILL_OBSERVATION_CHARS,
    )


# --- tool search ---------------------------------------------------------------
#
# BM25 (k1 = 1.2, b = 0.75) over each deferred tool's name and description. A
# name's words count twice (a tool named for the query beats one that mentions
# it). Words are lowercase runs of letters and digits; camelCase and snake_case
# names split into words; a trailing "s" is dropped from words longer than
# three letters, so "orders" finds "order". A tool scoring 0 is not returned.

_K1 = 1.2
_B = 0.75
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_WORD = re.compile(r"[a-z0-9]+")


def search_words(text: str) -> list[str]:
    words = _WORD.findall(_CAMEL.sub(r"\1 \2", text).lower())
    return [w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words]


def _document(contract: ToolContract) -> list[str]:
    name = search_words(contract.name)
    return name + name + search_words(contract.description)


def search_tools(
    query: str, contracts: Sequence[ToolContract], *, limit: int = TOOL_SEARCH_LIMIT
) -> list[tuple[ToolContract, float]]:
    """The `limit` best matches for `query` by BM25, best first (ties by name)."""
    terms = set(search_words(query))
    if not terms or not contracts:
        return []
    documents = [Counter(_document(contract)) for contract in contracts]
    lengths = [sum(doc.values()) for doc in documents]
    average = sum(lengths) / len(lengths) or 1.0
    count = len(documents)
    frequency = {t: sum(1 for doc in documents if t in doc) for t in terms}
    scored: list[tuple[ToolContract, float]] = []
    for contract, doc, length in zip(contracts, documents, lengths, strict=True):
        score = 0.0
        for term in terms:
            hits = doc.get(term, 0)
            if not hits:
                continue
            df = frequency[term]
            idf = math.log(1 + (count - df + 0.5) / (df + 0.5))
            norm = hits + _K1 * (1 - _B + _B * length / average)
            score += idf * hits * (_K1 + 1) / norm
        if score > 0:
            scored.append((contract, round(score, 4)))
    scored.sort(key=lambda pair: (-pair[1], pair[0].name))
    return scored[:limit]


def tool_search_tool(deferred: Sequence[ToolContract]) -> Tool:
    """`tool_search` over the agent's deferred tools; its result's `loaded` names
    the tools the host sends from the next turn on (`remember_loaded`)."""
    contracts = list(deferred)

    def search(arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        query = arguments["query"]
        found = search_tools(query, contracts)
        data: dict[str, Any] = {
            "query": query,
            "tools": [
                {"name": c.name, "description": c.description, "score": score}
                for c, score in found
            ],
            "loaded": [c.name for c, _ in found],
        }
        if found:
            data["note"] = "These tools can be called from your next turn on."
        else:
            data["note"] = (
                f"No tool matched among {len(contracts)}; try other words for "
                "what the tool should do."
            )
        return ToolResult.success(data)

    contract = ToolContract(
        name=TOOL_SEARCH,
        description=(
            "Find tools you do not see yet by what they do. Searches the names "
            f"and descriptions of {len(contracts)} more tools and returns up to "
            f"{TOOL_SEARCH_LIMIT}; those found can be called from your next turn "
            "on. Use it when no tool you have fits the task."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "query": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 500,
                    "description": "Words for what the tool should do.",
                }
            },
            "required": ["query"],
        },
        effect=Effect.READ_ONLY,
        idempotency=Idempotency.NATURAL,
        source=ToolSource.BUILTIN,
    )
    return Tool(contract, search, timeout_seconds=None)


def is_deferred(settings: Any) -> bool:
    """Whether an agent's tool_settings[ref] expose the tool `deferred` (found
    through tool_search) rather than `direct` (the default)."""
    return isinstance(settings, Mapping) and settings.get("exposure") == "deferred"


def remember_loaded(loaded: list[str], call_name: str, result: ToolResult) -> list[str]:
    """Add the tools a `tool_search` result found to the run's `loaded` list (in
    place); returns those new to it."""
    if call_name != TOOL_SEARCH or not result.ok:
        return []
    data = result.data if isinstance(result.data, Mapping) else {}
    added: list[str] = []
    for name in data.get("loaded") or []:
        if isinstance(name, str) and name not in loaded:
            loaded.append(name)
            added.append(name)
    return added


def not_loaded_result(name: str) -> ToolResult:
    """A deferred tool called before tool_search found it: not executed."""
    return ToolResult.failure(
        ErrorCode.ENOTOOL,
        f"{name} is not loaded, so it was not executed: call {TOOL_SEARCH} with "
        "words for what you need first; the tools it finds can be called from "
        "your next turn on",
        suggested_action=str(SuggestedAction.CHOOSE_LISTED_TOOL),
    )
