"""A scripted LLM judge: answers the eval judge's PASS/FAIL prompt with no model.

The control plane's `llm_judge` grader (runs/evals/judge.py) sends a rubric, the
task, the agent's tool calls and its final answer, and reads back "PASS" or
"FAIL" and a reason. This judge reads the same prompt and checks each clause of
the rubric it knows against the transcript, as written rules: so the demo's
suite runs with no API key, and a verdict changes when the agent's answer does
(an answer without an apology fails "apologizes"). A rubric clause it has no
rule for gets no verdict ("CANNOT JUDGE"), which the grader reports as an
error, never as a pass.

Pure Python, like the rest of the dev server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The sections of the grader's prompt (runs/evals/judge.py `judge_messages`;
# a test builds that prompt and judges it here, so the two agree).
SECTIONS = {
    "rubric": "Rubric:",
    "task": "Task given to the agent:",
    "calls": "Tool calls the agent made:",
    "answer": "The agent's final answer:",
}
_CALL_LINE = re.compile(r"^- ([A-Za-z0-9_.:/-]+)\(", re.MULTILINE)
_APOLOGY = re.compile(r"\b(sorry|apologi[sz]e[sd]?|apologies)\b", re.IGNORECASE)
# A next step: something that will happen, or something the customer is asked to
# do, or a date it happens by.
_NEXT_STEP = re.compile(
    r"\b(will (arrive|ship|reach|contact|be in touch|get back|send|follow up)"
    r"|on its way|is being shipped|please (send|reply|share|upload|attach|contact)"
    r"|could you (send|share|upload|attach)|you can (expect|track|reply|send)"
    r"|\d{4}-\d{2}-\d{2})",
    re.IGNORECASE,
)
# An identifier no customer-facing text should carry: snake_case names.
_IDENTIFIER = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


@dataclass(frozen=True)
class Transcript:
    rubric: str
    task: str
    tools_called: tuple[str, ...]
    answer: str


def transcript_of(prompt: str) -> Transcript | None:
    """The judge prompt's sections, or None when it is not a judge prompt."""
    at = {name: prompt.find(head) for name, head in SECTIONS.items()}
    if any(position < 0 for position in at.values()):
        return None
    order = sorted(at, key=at.__getitem__)
    text: dict[str, str] = {}
    for i, name in enumerate(order):
        start = at[name] + len(SECTIONS[name])
        end = at[order[i + 1]] if i + 1 < len(order) else len(prompt)
        text[name] = prompt[start:end].strip()
    answer = text["answer"]
    # The grader ends its prompt with the instruction; it is not the answer.
    answer = answer.rsplit("\n\nAnswer PASS or FAIL", 1)[0].strip()
    return Transcript(
        rubric=text["rubric"],
        task=text["task"],
        tools_called=tuple(_CALL_LINE.findall(text["calls"])),
        answer="" if answer == "(none)" else answer,
    )


Check = Callable[[Transcript], tuple[bool, str]]


def _apologizes(t: Transcript) -> tuple[bool, str]:
    found = _APOLOGY.search(t.answer)
    if found:
        return True, f"apologizes ({found.group(0)!r})"
    return False, "the answer does not apologize"


def _next_step(t: Transcript) -> tuple[bool, str]:
    found = _NEXT_STEP.search(t.answer)
    if found:
        return True, f"gives a next step ({found.group(0)!r})"
    return False, "the answer gives no clear next step"


def _no_internal_names(t: Transcript) -> tuple[bool, str]:
    named = [tool for tool in t.tools_called if tool.lower() in t.answer.lower()]
    named += [n for n in _IDENTIFIER.findall(t.answer) if n not in named]
    if named:
        return False, f"the answer names internal {', '.join(sorted(set(named)))}"
    return True, "mentions no internal names"


# A rubric clause matched by the pattern is checked by the rule.
RULES: Sequence[tuple[re.Pattern[str], Check]] = (
    (re.compile(r"\bapologi[sz]e", re.IGNORECASE), _apologizes),
    (re.compile(r"\bnext step\b", re.IGNORECASE), _next_step),
    (re.compile(r"\bno internal names?\b", re.IGNORECASE), _no_internal_names),
)


def _clauses(rubric: str) -> list[str]:
    # "(tools, systems ...)" explains a clause; it is not one of its own.
    plain = re.sub(r"\([^)]*\)", "", rubric)
    return [c.strip(" .\n") for c in re.split(r"[;\n]|\.\s", plain) if c.strip(" .")]


def judge_reply(prompt: str) -> str:
    """The judge's answer to a prompt: "PASS ..." or "FAIL ..." with the reason,
    or "CANNOT JUDGE ..." when the prompt is not one, or a clause has no rule."""
    transcript = transcript_of(prompt)
    if transcript is None:
        return "CANNOT JUDGE: this is not an eval judge prompt"
    results: list[tuple[bool, str]] = []
    for clause in _clauses(transcript.rubric):
        rule = next((check for pattern, check in RULES if pattern.search(clause)), None)
        if rule is None:
            return f"CANNOT JUDGE: the scripted judge has no rule for {clause!r}"
        results.append(rule(transcript))
    if not results:
        return "CANNOT JUDGE: the rubric is empty"
    failed = [reason for ok, reason in results if not ok]
    if failed:
        return "FAIL " + "; ".join(failed)
    return "PASS " + "; ".join(reason for _, reason in results)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "\n".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping)
        )
    return ""


def judge_request_reply(body: Mapping[str, Any]) -> str:
    """The judge's answer to a request body: the last user message's prompt."""
    users = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    return judge_reply(_text_of(users[-1].get("content")) if users else "")
