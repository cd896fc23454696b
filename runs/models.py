"""Agents, runs, their steps and tool calls (DESIGN.md §3)."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.db import models

from controlplane.models import Tenant
from runs.branch_models import SessionBranch
from runs.engine.stop import TERMINAL_STATUSES
from runs.eval_models import EvalCase, EvalRun, EvalSuite, EvalTrial
from runs.memory_models import MemoryFile
from runs.review_models import RunReview
from runs.rollup_models import RunDurationRollup, RunHourRollup, ToolHourRollup
from runs.session_models import SessionEntry
from runs.steering_models import RunMessage

__all__ = [
    "Agent",
    "AgentVersion",
    "EvalCase",
    "EvalRun",
    "EvalSuite",
    "EvalTrial",
    "McpServer",
    "MemoryFile",
    "McpTool",
    "ModelEndpoint",
    "Run",
    "RunDurationRollup",
    "RunHourRollup",
    "RunMessage",
    "RunReview",
    "SessionBranch",
    "SessionEntry",
    "Step",
    "ToolCall",
    "ToolHourRollup",
]


class ModelEndpoint(models.Model):
    """Where a tenant's agents reach a model: the protocol, the URL and the name of
    the secret holding its key (never the key itself)."""

    class Kind(models.TextChoices):
        OPENAI = "openai"  # any OpenAI-compatible Chat Completions endpoint
        ANTHROPIC = "anthropic"  # the Messages API, through the official SDK
        SCRIPTED = "scripted"  # the replies written in the agent version's script

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="model_endpoints"
    )
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    base_url = models.CharField(max_length=500, blank=True)
    # The name of a tenant secret (controlplane.secrets), or "" for none.
    api_key_secret = models.CharField(max_length=64, blank=True)
    # timeout_seconds, max_retries, stream, ... (docs/agents.md).
    options = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "slug"], name="model_endpoint_slug_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return self.slug


class Agent(models.Model):
    """An agent's identity; what it runs with is its current `AgentVersion`.

    Deleting one is soft (`deleted_at`): its runs keep the versions they ran."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="agents")
    slug = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    disabled = models.BooleanField(default=False)
    deleted_at = models.DateTimeField(null=True, blank=True)
    # None only for the placeholder agent of runs sent over OTLP (never run here).
    current_version = models.ForeignKey(
        "AgentVersion",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # A deleted agent's slug may be taken again.
            models.UniqueConstraint(
                fields=["tenant", "slug"],
                condition=models.Q(deleted_at__isnull=True),
                name="agent_slug_per_tenant",
            )
        ]

    def __str__(self) -> str:
        return self.slug


class AgentVersion(models.Model):
    """One immutable configuration of an agent, numbered 1..n; every edit adds
    one, and a run pins the one it started with (`Run.agent_version`)."""

    # The configuration fields, in the order a comparison lists them.
    CONFIG_FIELDS = (
        "name",
        "endpoint",
        "model",
        "fallback_endpoint",
        "fallback_model",
        "evaluated_models",
        "system_prompt",
        "skills",
        "tools",
        "tool_settings",
        "default_limits",
        "evaluator",
        "script",
        "guardrails",
        "hooks",
        "compaction_threshold",
        "subagents",
    )

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # The agent's display name when this version was made.
    name = models.CharField(max_length=200)
    endpoint = models.ForeignKey(
        ModelEndpoint, on_delete=models.PROTECT, related_name="agent_versions"
    )
    model = models.CharField(max_length=200)
    fallback_endpoint = models.ForeignKey(
        ModelEndpoint,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="fallback_of_versions",
    )
    fallback_model = models.CharField(max_length=200, blank=True)
    # The models the agent was evaluated with; the fallback model is one of them.
    evaluated_models = models.JSONField(default=list, blank=True)
    system_prompt = models.TextField(blank=True)
    # [{"name", "summary", "body"}]: the prompt carries their one-line index and
    # load_skill returns a body (runs/engine/disclosure.py, docs/agents.md).
    skills = models.JSONField(default=list, blank=True)
    tools = models.JSONField(default=list, blank=True)  # tool refs (docs/agents.md)
    tool_settings = models.JSONField(default=dict, blank=True)  # ref -> settings
    default_limits = models.JSONField(default=dict, blank=True)
    evaluator = models.CharField(max_length=100, blank=True)
    script = models.JSONField(default=list, blank=True)  # scripted endpoint's replies
    # Input/output checks and built-in hooks (runs.engine.guardrails, .hooks).
    guardrails = models.JSONField(default=list, blank=True)
    hooks = models.JSONField(default=list, blank=True)
    # The share of the model's context window (price table) above which the
    # context is compacted before a model call (runs.services.compaction).
    compaction_threshold = models.FloatField(default=0.8)
    # Agents of the tenant it may call as tools (`agent__<slug>`): [{"agent":
    # slug, "description": text}] (runs.services.subagent_config).
    subagents = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["agent", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["agent", "number"], name="one_agent_version_per_number"
            )
        ]

    def __str__(self) -> str:
        return f"{self.agent.slug} v{self.number}"


class Run(models.Model):
    class Status(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        WAITING_APPROVAL = "waiting_approval"
        WAITING_INPUT = "waiting_input"  # for a person's answer (approvals.Question)
        # Its sub-agent runs work; it holds no worker (runs.services.subagents).
        WAITING_SUBAGENTS = "waiting_subagents"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        UNVERIFIED = "unverified"
        BUDGET_EXHAUSTED = "budget_exhausted"
        POLICY_BLOCKED = "policy_blocked"
        CANCELLED = "cancelled"

    # The engine decides which statuses end a run; the model mirrors it.
    TERMINAL = frozenset(map(Status, map(str, TERMINAL_STATUSES)))

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs")
    agent = models.ForeignKey(Agent, on_delete=models.PROTECT, related_name="runs")
    # The configuration the run started with and runs with to its end; None
    # only for runs sent over OTLP (runs.services.external).
    agent_version = models.ForeignKey(
        AgentVersion,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="runs",
    )
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    input = models.TextField()
    # The end user the run serves (a customer id such as "c-8812"): the scope of
    # its memory and of the per-user budget limits; "" for none.
    end_user = models.CharField(max_length=128, blank=True)
    status = models.CharField(
        max_length=20, choices=Status.choices, default=Status.QUEUED, db_index=True
    )
    stop_reason = models.CharField(max_length=32, blank=True)
    stop_detail = models.TextField(blank=True)
    limits = models.JSONField(default=dict)
    # Run caps raised by approved budget extensions ({"max_cost": "1.5"}), added
    # on top of the caps above after the tenant's ceiling has lowered them.
    limit_extensions = models.JSONField(default=dict, blank=True)
    steps = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal(0))
    # Engine state between steps: transcript, usage, no-progress window.
    engine_state = models.JSONField(default=dict)
    final_answer = models.TextField(blank=True)
    evaluation = models.JSONField(null=True, blank=True)
    # Single writer: `version` moves on every write; the lease says who may write.
    version = models.PositiveIntegerField(default=0)
    step_token = models.UUIDField(null=True, blank=True)
    lease_owner = models.CharField(max_length=64, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The Celery worker (node name) holding the lease: its heartbeat in Redis
    # says whether it still lives (controlplane.celery.workers_gone).
    lease_worker = models.CharField(max_length=200, blank=True)
    # When the message of the current step token was published: a step not
    # leased long after this, whose message is in no queue, was lost (recovery).
    enqueued_at = models.DateTimeField(null=True, blank=True)
    cancel_requested = models.BooleanField(default=False)
    trace_id = models.CharField(max_length=32, blank=True)
    # The world its tools act in: a shop.ShopWorld an eval trial got fresh (by
    # id: the world may be cleaned up before the run's record); None: the
    # tenant's real one.
    world_id = models.UUIDField(null=True, blank=True)
    # A sub-agent run: the run whose tool call started it (and that call); it
    # shares its parent's trace, its root span under the call's span.
    parent_run = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="child_runs",
    )
    parent_tool_call = models.ForeignKey(
        "ToolCall",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="child_runs",
    )
    depth = models.PositiveSmallIntegerField(default=0)  # 0: a top-level run
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # When the ended run settled: its run_finished hooks ran and nothing goes on
    # for it automatically (a recovery branch still running, a follow-up queued
    # while it ended); a run reads "complete" only then (runs/services/settle.py).
    settled_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # What the overview's hourly rollups hold for this run (runs/rollups.py):
    # pending until an ended run is counted there, and again when an external
    # run changes after it was (its old share is then taken back).
    rollup_pending = models.BooleanField(default=True)
    rollup_status = models.CharField(max_length=20, blank=True)
    rollup_cost = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True
    )
    rollup_duration = models.SmallIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "status", "-created_at"]),
            # The runs the overview reads one by one: those its rollups do not
            # hold yet (few: the unended and the just ended).
            models.Index(
                fields=["tenant", "created_at"],
                condition=models.Q(rollup_pending=True),
                name="run_rollup_pending",
            ),
            # A trace id across tenants: an external agent's gate or budget
            # reservation on another tenant's trace is refused.
            models.Index(
                fields=["trace_id"],
                condition=~models.Q(trace_id=""),
                name="run_trace_id",
            ),
            # The runs list's default order (newest first, id breaking ties):
            # its first page reads 50 index entries instead of sorting the tenant.
            models.Index(
                fields=["tenant", "-created_at", "-id"], name="run_list_newest"
            ),
        ]
        constraints = [
            # One top-level run per trace in a tenant: OTLP ingest finds a
            # trace's external run by it, and a native run's trace is never
            # another run's; its sub-agent runs share it (one tree, one trace).
            models.UniqueConstraint(
                fields=["tenant", "trace_id"],
                condition=~models.Q(trace_id="") & models.Q(parent_run__isnull=True),
                name="one_run_per_trace",
            )
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @property
    def is_settled(self) -> bool:
        return self.settled_at is not None


class Step(models.Model):
    """One model call and what it proposed, recorded before any tool runs."""

    # Looked up by run through the (run, index) unique index: no index of its own,
    # one B-tree fewer to write per step.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="step_rows", db_index=False
    )
    index = models.PositiveIntegerField()
    provider = models.CharField(max_length=32, blank=True)
    provider_request_id = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200, blank=True)
    finish_reason = models.CharField(max_length=32, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal(0))
    reply = models.JSONField(default=dict)  # the raw reply, replayable
    action = models.JSONField(default=dict)  # what the host decoded from it
    error = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="one_step_per_index")
        ]

    def __str__(self) -> str:
        return f"step {self.index} of {self.run_id}"


class ToolCall(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        WAITING_APPROVAL = "waiting_approval"
        WAITING_INPUT = "waiting_input"  # its question waits for an answer
        APPROVED = "approved"
        EXECUTING = "executing"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        REFUSED = "refused"  # lookup, validation or budget said no: never executed
        DENIED = "denied"  # policy or a reviewer said no: never executed
        UNKNOWN = "unknown"  # a crashed write whose outcome the host cannot know
        CANCELLED = "cancelled"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Looked up by run through the (run, call_id) unique index.
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="tool_call_rows", db_index=False
    )
    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="tool_calls")
    position = models.PositiveIntegerField()
    call_id = models.CharField(max_length=200)
    tool_name = models.CharField(max_length=200)
    args = models.JSONField(default=dict)
    raw_args = models.TextField(blank=True)
    args_sha256 = models.CharField(max_length=64)
    idempotency_key = models.CharField(max_length=64)
    effect = models.CharField(max_length=32, blank=True)
    status = models.CharField(
        max_length=20, choices=Status.choices, default=Status.PENDING
    )
    attempts = models.PositiveSmallIntegerField(default=0)
    result = models.JSONField(null=True, blank=True)  # the result envelope
    observation = models.JSONField(null=True, blank=True)  # what the model saw
    artifact = models.JSONField(null=True, blank=True)  # full output when bounded
    sandbox_result = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["step__index", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "call_id"], name="one_call_per_id")
        ]

    def __str__(self) -> str:
        return f"{self.tool_name} ({self.status})"


class McpServer(models.Model):
    """A tenant's MCP server: its tools become agent tools `mcp:<slug>/<tool>`.

    Streamable HTTP (reached from the worker, with an optional tenant secret sent
    as its auth header) or a stdio command that runs inside the sandbox.
    """

    class Transport(models.TextChoices):
        HTTP = "http"
        STDIO = "stdio"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="mcp_servers"
    )
    slug = models.SlugField(max_length=40)
    name = models.CharField(max_length=200)
    transport = models.CharField(max_length=8, choices=Transport.choices)
    url = models.CharField(max_length=500, blank=True)
    command = models.JSONField(default=list, blank=True)  # argv, never a shell string
    # The name of a tenant secret (controlplane.secrets), never its value.
    auth_secret = models.CharField(max_length=64, blank=True)
    auth_header = models.CharField(max_length=100, default="Authorization")
    auth_prefix = models.CharField(max_length=40, default="Bearer ", blank=True)
    # "host:port" entries: what a stdio server may reach through the egress proxy,
    # and the private or loopback hosts an HTTP server's URL may name.
    network = models.JSONField(default=list, blank=True)
    # A stdio server's egress credentials, by "host:port" of its network: the
    # tenant secret (by name) the egress proxy adds as a header (runs/tools/egress.py).
    credentials = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    last_refresh_at = models.DateTimeField(null=True, blank=True)
    last_refresh_status = models.CharField(max_length=16, blank=True)  # ok | error
    last_refresh_error = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "slug"], name="mcp_server_slug_per_tenant"
            )
        ]

    def __str__(self) -> str:
        return self.slug


class McpTool(models.Model):
    """One tool of an MCP server, pinned: the definition an admin accepted is what
    the model sees and what may be called; a server that changes it later gets
    the tool disabled (`changed`) until the new definition is accepted."""

    class Status(models.TextChoices):
        ACTIVE = "active"
        CHANGED = "changed"  # the server's definition is not the accepted one
        REMOVED = "removed"  # the server no longer lists it
        INVALID = "invalid"  # its input schema is not acceptable to the host

    class Effect(models.TextChoices):
        READ_ONLY = "read_only"
        IDEMPOTENT_WRITE = "idempotent_write"
        WRITE = "write"
        IRREVERSIBLE_EXTERNAL = "irreversible_external"

    class Idempotency(models.TextChoices):
        NATURAL = "natural"
        REQUIRED_KEY = "required_key"
        NONE = "none"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    server = models.ForeignKey(
        McpServer, on_delete=models.CASCADE, related_name="tools"
    )
    name = models.CharField(max_length=128)
    # What the server lists now (seen at the last refresh or call).
    description = models.TextField(blank=True)
    input_schema = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict, blank=True)  # untrusted hints
    definition_sha256 = models.CharField(max_length=64)
    # What an admin accepted: the model sees this, and a call needs the server to
    # list exactly this.
    accepted_sha256 = models.CharField(max_length=64, blank=True)
    accepted_description = models.TextField(blank=True)
    accepted_input_schema = models.JSONField(default=dict)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    accepted_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(
        max_length=10, choices=Status.choices, default=Status.ACTIVE
    )
    problem = models.TextField(blank=True)  # why it is invalid
    # Set by the tenant; empty means unknown: an irreversible external write.
    effect = models.CharField(max_length=24, choices=Effect.choices, blank=True)
    idempotency = models.CharField(
        max_length=16, choices=Idempotency.choices, default=Idempotency.NONE
    )
    requires_approval = models.BooleanField(default=True)
    timeout_seconds = models.PositiveIntegerField(default=30)
    # The contract's cost.quota, set by the tenant ("5/run;100/day"); empty: none.
    quota = models.CharField(max_length=200, blank=True)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["server", "name"], name="mcp_tool_name_per_server"
            )
        ]

    def __str__(self) -> str:
        return f"{self.server_id}/{self.name} ({self.status})"


class ExternalGate(models.Model):
    """A tool call of an agent running outside the control plane, put to the
    tenant's policy over HTTP (docs/external-agents.md, Gates). Its run is the
    external run of the caller's trace; a call that needs a human has an
    ApprovalRequest of kind `external_call`, and deciding that finalises this."""

    class Status(models.TextChoices):
        ALLOWED = "allowed"
        DENIED = "denied"
        PENDING = "pending"
        APPROVED = "approved"
        EXPIRED = "expired"
        CANCELLED = "cancelled"

    class Webhook(models.TextChoices):
        NONE = ""  # no webhook_url
        WAITING = "waiting"  # the gate is not final yet
        DUE = "due"  # to be delivered at webhook_next_at
        DELIVERED = "delivered"
        FAILED = "failed"  # every attempt failed

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="gates")
    approval = models.OneToOneField(
        "approvals.ApprovalRequest",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="gate",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+"
    )
    tool = models.CharField(max_length=64)
    arguments = models.JSONField()  # as asked; an approver's edit is the approval's
    args_sha256 = models.CharField(max_length=64)
    input_schema = models.JSONField(null=True, blank=True)  # the caller's, prepared
    effect = models.CharField(max_length=24, choices=McpTool.Effect.choices)
    agent = models.CharField(max_length=100, blank=True)
    span_id = models.CharField(max_length=16, blank=True)  # the caller's span
    decision = models.CharField(max_length=20)  # the policy's: allow | deny | ...
    rule = models.CharField(max_length=200)
    reason = models.TextField(blank=True)
    status = models.CharField(max_length=12, choices=Status.choices)
    idempotency_key = models.CharField(max_length=255, blank=True)
    request_sha256 = models.CharField(max_length=64)  # what the key was used for
    webhook_url = models.URLField(max_length=2000, blank=True)
    webhook_state = models.CharField(
        max_length=10, choices=Webhook.choices, blank=True, default=Webhook.NONE
    )
    webhook_attempts = models.PositiveSmallIntegerField(default=0)
    webhook_next_at = models.DateTimeField(null=True, blank=True)
    webhook_last_error = models.CharField(max_length=500, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finalised_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["webhook_state", "webhook_next_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="one_gate_per_idempotency_key",
            )
        ]

    def __str__(self) -> str:
        return f"gate {self.tool} ({self.status})"
