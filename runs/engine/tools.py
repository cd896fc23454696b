"""Tools, the registry, and execution wrapped into result envelopes.

`execute_tool` never raises: handler exceptions and timeouts become envelopes. A
timed-out in-process handler cannot be killed (it keeps its thread); anything that
runs code or commands must go through the sandbox runner, which kills whole trees.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from runs.engine.contracts import ContractError, Effect, Idempotency, ToolContract
from runs.engine.envelope import ErrorCode, SuggestedAction, ToolFailure, ToolResult

DEFAULT_TOOL_TIMEOUT_SECONDS = 30.0


def idempotency_key_for(run_id: str, call_id: str) -> str:
    """The business idempotency key of a call: stable across retries and crashes."""
    return hashlib.sha256(f"{run_id}:{call_id}".encode()).hexdigest()[:32]


# The host's lookup of one of the run's tenant's secrets by name; raises
# LookupError (naming the secret, never a value) when it is not set.
SecretReader = Callable[[str], str]


@dataclass(frozen=True)
class ToolContext:
    """What a handler knows about the call besides its arguments.

    Secrets come only through `secret(name)`, which answers for the names the
    tool's `auth_scope` lists (`secrets:...`) and nothing else: a tool never sees
    another tool's secret, and the context holds no value, only the reader.
    """

    run_id: str
    call_id: str
    tenant_id: str = ""
    idempotency_key: str = ""
    # The world the call acts in (an eval trial's own shop); "": the tenant's real
    # one. Opaque here: the tools that keep state scope their rows by it.
    world_id: str = ""
    # The end user the run serves ("" for none): the scope of its memory.
    end_user: str = ""
    sandbox: Callable[..., Any] | None = None  # the host's sandbox runner entry
    attributes: Mapping[str, Any] = field(default_factory=dict)
    allowed_secrets: frozenset[str] = frozenset()
    secret_reader: SecretReader | None = field(default=None, repr=False)

    @classmethod
    def for_call(
        cls,
        run_id: str,
        call_id: str,
        *,
        tenant_id: str = "",
        world_id: str = "",
        end_user: str = "",
        sandbox: Callable[..., Any] | None = None,
        attributes: Mapping[str, Any] | None = None,
        allowed_secrets: frozenset[str] = frozenset(),
        secret_reader: SecretReader | None = None,
    ) -> ToolContext:
        return cls(
            run_id=run_id,
            call_id=call_id,
            tenant_id=tenant_id,
            idempotency_key=idempotency_key_for(run_id, call_id),
            world_id=world_id,
            end_user=end_user,
            sandbox=sandbox,
            attributes=dict(attributes or {}),
            allowed_secrets=allowed_secrets,
            secret_reader=secret_reader,
        )

    def secret(self, name: str) -> str:
        """The value of a secret the tool's auth_scope names; raises ToolFailure
        EACCES for any other name, or when the host provides no secrets."""
        if name not in self.allowed_secrets:
            raise ToolFailure(
                ErrorCode.EACCES,
                f"secret {name!r} is outside this tool's auth_scope",
                suggested_action=str(SuggestedAction.STOP_AND_REQUEST_HUMAN),
            )
        if self.secret_reader is None:
            raise ToolFailure(
                ErrorCode.EACCES, f"secret {name!r} is not available here"
            )
        try:
            return self.secret_reader(name)
        except LookupError as missing:
            # The lookup's message names the secret ("secret 'X' is not set in
            # this tenant"); it never carries a value.
            raise ToolFailure(
                ErrorCode.EACCES,
                str(missing.args[0]) if missing.args else f"secret {name!r} is not set",
                suggested_action=str(SuggestedAction.STOP_AND_REQUEST_HUMAN),
            ) from None


ToolHandler = Callable[[dict[str, Any], ToolContext], "ToolResult | Mapping[str, Any]"]
# A precondition check returns None when the call may go ahead, else why not.
PreconditionCheck = Callable[[Mapping[str, Any], ToolContext], "str | None"]


@dataclass(frozen=True)
class Tool:
    contract: ToolContract
    handler: ToolHandler
    check_preconditions: PreconditionCheck | None = None
    timeout_seconds: float | None = DEFAULT_TOOL_TIMEOUT_SECONDS
    # Exposure (docs/agents.md): a deferred tool is not sent to the model until
    # `tool_search` found it in this run, and is not callable before.
    deferred: bool = False
    # The observation bound of this tool's results, when it is not the run's
    # (a skill's body is returned whole).
    observation_chars: int | None = None

    def __post_init__(self) -> None:
        if self.contract.preconditions and self.check_preconditions is None:
            # A declared precondition nobody checks would be a promise the host
            # does not keep.
            raise ContractError(
                f"tool {self.contract.name!r} declares preconditions but no check"
            )

    @property
    def name(self) -> str:
        return self.contract.name

    @property
    def money_cost(self) -> Decimal:
        return Decimal(self.contract.cost.money_cents) / 100


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(self, tools: list[Tool] | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools or []:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def visible(self, loaded: Collection[str] = ()) -> list[Tool]:
        """The tools sent to the model: every direct tool, and the deferred ones
        `loaded` names (found through tool_search), in registration order."""
        return [t for t in self._tools.values() if not t.deferred or t.name in loaded]

    def model_tools(self, loaded: Collection[str] = ()) -> list[dict[str, Any]]:
        """The `tools` list for the model: name, description and schema only."""
        return [tool.contract.model_view() for tool in self.visible(loaded)]

    @property
    def deferred(self) -> list[Tool]:
        return [tool for tool in self._tools.values() if tool.deferred]

    def observation_chars_for(self, name: str, default: int) -> int:
        tool = self._tools.get(name)
        if tool is None or tool.observation_chars is None:
            return default
        return max(default, tool.observation_chars)


def unmet_precondition(
    tool: Tool, arguments: Mapping[str, Any], ctx: ToolContext
) -> str | None:
    """Why the tool's declared preconditions do not hold now, or None (fail-safe:
    a check that raises counts as not holding)."""
    if tool.check_preconditions is None:
        return None
    try:
        return tool.check_preconditions(arguments, ctx)
    except Exception as exc:  # noqa: BLE001 - a failing check must not run the call
        return f"the precondition check failed ({type(exc).__name__})"


def precondition_failed_result(unmet: str) -> ToolResult:
    """Nothing ran (spec §1.5's example: EPERM, stop and request a human)."""
    return ToolResult.failure(ErrorCode.EPERM, f"precondition failed: {unmet}")


def _call_handler(
    tool: Tool, arguments: dict[str, Any], ctx: ToolContext
) -> ToolResult:
    unmet = unmet_precondition(tool, arguments, ctx)
    if unmet is not None:
        return precondition_failed_result(unmet)
    try:
        out = tool.handler(arguments, ctx)
    except ToolFailure as failure:
        return failure.result
    except TimeoutError:
        return ToolResult.failure(ErrorCode.ETIMEDOUT, f"{tool.name} timed out")
    except PermissionError as exc:
        return ToolResult.failure(ErrorCode.EACCES, f"{tool.name}: {exc}")
    except ValueError as exc:
        return ToolResult.failure(ErrorCode.EINVAL, f"{tool.name}: {exc}")
    except Exception as exc:  # noqa: BLE001 - no exception may cross the loop
        # No stack trace and no message text: it may carry SQL, URLs or secrets.
        return ToolResult.failure(
            ErrorCode.EINTERNAL, f"{tool.name} failed ({type(exc).__name__})"
        )
    if isinstance(out, ToolResult):
        return out
    if isinstance(out, Mapping):
        return ToolResult.success(dict(out))
    return ToolResult.failure(
        ErrorCode.EINTERNAL, f"{tool.name} returned {type(out).__name__}, not a result"
    )


def execute_tool(
    tool: Tool,
    arguments: Mapping[str, Any],
    context: ToolContext,
    *,
    timeout_seconds: float | None = None,
) -> ToolResult:
    """Run a validated, authorised call and return its envelope; never raises.

    `timeout_seconds` overrides the tool's own; `None` on both runs inline.
    """
    timeout = tool.timeout_seconds if timeout_seconds is None else timeout_seconds
    args = dict(arguments)
    context, read = _remembering_secrets(context)
    started = time.monotonic()
    if timeout is None:
        result = _call_handler(tool, args, context)
    else:
        box: list[ToolResult] = []
        worker = threading.Thread(
            target=lambda: box.append(_call_handler(tool, args, context)),
            name=f"tool-{tool.name}-{context.call_id}",
            daemon=True,
        )
        worker.start()
        worker.join(timeout)
        if box:
            result = box[0]
        else:
            uncertain = tool.contract.effective_effect is not Effect.READ_ONLY
            result = ToolResult.failure(
                ErrorCode.ETIMEDOUT,
                f"{tool.name} did not finish within {timeout:g}s"
                + ("; it may have taken effect" if uncertain else ""),
                retryable=not uncertain,
            )
    latency_ms = int((time.monotonic() - started) * 1000)
    # A secret the call read never comes back in its result (a server may say
    # its own token back): the result becomes the model's observation, a row and
    # a span.
    return result.without_values(list(read)).with_cost(latency_ms=latency_ms)


def _remembering_secrets(context: ToolContext) -> tuple[ToolContext, list[str]]:
    """The context with a reader that remembers each value it hands out."""
    read: list[str] = []
    reader = context.secret_reader
    if reader is None or not context.allowed_secrets:
        return context, read

    def remembering(name: str) -> str:
        value = reader(name)
        read.append(value)
        return value

    return replace(context, secret_reader=remembering), read


def unknown_outcome_result(tool_name: str) -> ToolResult:
    """The observation for a write interrupted by a crash that cannot be re-run."""
    return ToolResult.failure(
        ErrorCode.EUNKNOWN,
        f"the outcome of {tool_name} is unknown: the worker stopped after the call "
        "started and before its result was recorded; check the current state "
        "before calling it again",
    )


def may_rerun_after_crash(contract: ToolContract) -> bool:
    """Whether a call left without a result may simply run again.

    Reads re-run; writes re-run only when the tool honours the idempotency key
    (or is naturally idempotent). Anything else gets `unknown_outcome_result`.
    """
    effect = contract.effective_effect
    if effect is Effect.READ_ONLY:
        return True
    if not contract.trusted:
        return False
    if contract.idempotency is Idempotency.REQUIRED_KEY:
        return True
    return (
        effect is Effect.IDEMPOTENT_WRITE
        and contract.idempotency is Idempotency.NATURAL
    )
