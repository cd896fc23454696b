"""Runs, their data lifecycle, the sandbox runner and approvals."""

from __future__ import annotations

import os
import sysconfig
from typing import Any

from controlplane.environment import env
from controlplane.settings.base import (
    BASE_DIR,
    DEMO_API_SEEDERS,
    DEMO_SEEDERS,
    METRICS_COLLECTORS,
)
from controlplane.settings.broker import CELERY_BEAT_SCHEDULE

# Runs: caps every run starts from (an agent or a run request may only lower them).
RUN_DEFAULT_LIMITS: dict[str, Any] = {
    "max_steps": env.integer("RUN_MAX_STEPS", 50, minimum=1, help="Default step cap."),
    "max_tool_calls": env.integer(
        "RUN_MAX_TOOL_CALLS", 100, minimum=1, help="Default tool-call cap per run."
    ),
    "max_wall_seconds": env.number(
        "RUN_MAX_WALL_SECONDS", 900.0, minimum=1, help="Default active seconds per run."
    ),
}
RUN_RESERVE_OUTPUT_TOKENS = env.integer(
    "RUN_RESERVE_OUTPUT_TOKENS",
    1024,
    minimum=1,
    help="Output tokens reserved (and requested at most) per model call.",
)
RUN_MAX_INPUT_CHARS = env.integer(
    "RUN_MAX_INPUT_CHARS", 20_000, minimum=1, help="Longest run input accepted."
)
RUN_SUBAGENT_MAX_DEPTH = env.integer(
    "RUN_SUBAGENT_MAX_DEPTH",
    3,
    minimum=1,
    help="Deepest chain of sub-agent runs below a top-level run.",
)
RUN_SUBAGENT_MAX_CHILDREN = env.integer(
    "RUN_SUBAGENT_MAX_CHILDREN",
    20,
    minimum=1,
    help="Most sub-agent runs one run may start in all.",
)
RUN_LEASE_SECONDS = env.number(
    "RUN_LEASE_SECONDS",
    120.0,
    minimum=0.5,
    help="How long a worker's lease on a run lasts before recovery may take it over.",
)
RUN_MODEL_DEADLINE_SECONDS = env.number(
    "RUN_MODEL_DEADLINE_SECONDS",
    100.0,
    minimum=1,
    help="Longest one model call may take, all retries and backoffs included "
    "(keep it below RUN_LEASE_SECONDS).",
)
RUN_TOOL_RETRIES = env.integer(
    "RUN_TOOL_RETRIES",
    3,
    minimum=0,
    help="Automatic retries per tool per run of a transient error the tool marks "
    "retryable (reads and key-deduplicated writes only).",
)
RUN_TOOL_RETRY_BACKOFF_SECONDS = env.number(
    "RUN_TOOL_RETRY_BACKOFF_SECONDS",
    0.5,
    minimum=0,
    help="Delay before a tool's first automatic retry; doubles each retry, jittered.",
)
# The tenant's approval rules (approvals app) applied by runs; fail-safe: a raising
# hook denies.
RUN_POLICY_HOOK = "runs.services.policy.tenant_policy"
# Hook types an operator installs beside the built-in ones (runs.engine.hooks):
# dotted paths of mappings name -> HookType. Agent versions pick from them.
RUN_EXTRA_HOOK_TYPES = env.items(
    "RUN_EXTRA_HOOK_TYPES",
    "",
    help="Comma-separated dotted paths of extra hook-type registries.",
)
# The last resort against a step that never ends (SIGKILL, then redelivery). A
# step's model call ends within RUN_MODEL_DEADLINE_SECONDS (its lease is renewed
# meanwhile); the minute beyond the larger of that and the lease is for the
# step's tool calls and writes.
CELERY_TASK_TIME_LIMIT = int(max(RUN_LEASE_SECONDS, RUN_MODEL_DEADLINE_SECONDS)) + 60
RUN_ENQUEUE_GRACE_SECONDS = env.number(
    "RUN_ENQUEUE_GRACE_SECONDS",
    5.0,
    minimum=0.5,
    help="A step enqueued this long ago, with no lease and no message in the queue, "
    "was lost (a Redis restart, a worker that died whole): recovery enqueues it again.",
)
RUN_RECOVERY_INTERVAL_SECONDS = env.number(
    "RUN_RECOVERY_INTERVAL_SECONDS",
    5.0,
    minimum=1.0,
    help="How often beat runs the recovery of runs whose step was lost.",
)
CELERY_BEAT_SCHEDULE["runs-recover-stalled"] = {
    "task": "runs.tasks.recover_stalled_runs_task",
    "schedule": RUN_RECOVERY_INTERVAL_SECONDS,
}
RUN_SETTLE_GRACE_SECONDS = env.number(
    "RUN_SETTLE_GRACE_SECONDS",
    120.0,
    minimum=10.0,
    help="An ended run not settled this long after its end lost the worker that "
    "was ending it: a sweep runs its run_finished hooks and settles it.",
)
CELERY_BEAT_SCHEDULE["runs-settle-stranded"] = {
    "task": "runs.tasks.runs_settle_stranded_task",
    "schedule": 30.0,
}
EVAL_SWEEP_INTERVAL_SECONDS = env.number(
    "EVAL_SWEEP_INTERVAL_SECONDS",
    10.0,
    minimum=1.0,
    help="How often beat grades eval trials whose run ended outside a step "
    "(a cancel, an expired approval) and finishes eval runs that are done.",
)
CELERY_BEAT_SCHEDULE["runs-eval-sweep"] = {
    "task": "runs.tasks.eval_runs_sweep_task",
    "schedule": EVAL_SWEEP_INTERVAL_SECONDS,
}
DEMO_SEEDERS.append("runs.demo.demo_seed_shop")
DEMO_SEEDERS.append("runs.demo.demo_seed_eval_task_07")
# The eval suite first: it needs no sandbox, so a host without bubblewrap (where
# the warranty agent's seed is refused) still gets it.
DEMO_API_SEEDERS.append("runs.evals.demo.demo_seed_evals_through_api")
DEMO_API_SEEDERS.append("runs.demo_warranty.demo_seed_warranty_agent")
METRICS_COLLECTORS.append("runs.metrics.run_gauges")

# Data lifecycle (docs/data.md): terminal runs older than a tenant's retention are
# deleted with everything recorded about them; the budget ledger is kept.
DATA_RETENTION_DAYS = env.integer(
    "DATA_RETENTION_DAYS",
    0,
    minimum=0,
    help="Days a terminal run is kept for a tenant that set no retention of its "
    "own (0: keep forever).",
)
DATA_RETENTION_BATCH_SIZE = env.integer(
    "DATA_RETENTION_BATCH_SIZE",
    500,
    minimum=1,
    help="Runs deleted per transaction by the retention pass.",
)
DATA_RETENTION_INTERVAL_SECONDS = env.number(
    "DATA_RETENTION_INTERVAL_SECONDS",
    3600.0,
    minimum=60.0,
    help="How often beat deletes runs past their tenant's retention.",
)
CELERY_BEAT_SCHEDULE["runs-retention"] = {
    "task": "runs.tasks.retention_sweep_task",
    "schedule": DATA_RETENTION_INTERVAL_SECONDS,
}

# The overview reads hourly rollups of ended runs (runs/rollups.py); until a
# pass counts a run it reads the run itself, so this only bounds that work.
RUNS_ROLLUP_INTERVAL_SECONDS = env.number(
    "RUNS_ROLLUP_INTERVAL_SECONDS",
    30.0,
    minimum=1.0,
    help="How often beat counts ended runs into the overview's hourly rollups.",
)
CELERY_BEAT_SCHEDULE["runs-roll-up"] = {
    "task": "runs.tasks.runs_roll_up_task",
    "schedule": RUNS_ROLLUP_INTERVAL_SECONDS,
}

# Sandbox runner (run_code and any tool that runs a command).
SANDBOX_ROOT = env.string(
    "SANDBOX_ROOT",
    str(BASE_DIR / ".run" / "sandbox"),
    help="Where sandbox workspaces and state live (must be traversable by uid 65534).",
)
# The product's minimum set (runs.sandbox.spec.DEFAULT_REQUIRED_LAYERS); lowering it
# is an operator's decision, and the enforcement map of every run shows the result.
SANDBOX_REQUIRED_LAYERS = env.items(
    "SANDBOX_REQUIRED_LAYERS",
    "bwrap,pidns,netns,mountns,uid_drop,no_new_privs,rlimits,"
    "cgroup_kill,memory_limit,pids_limit",
    help="Isolation layers without which the sandbox refuses to run anything.",
)
SANDBOX_WORKSPACE_MB = env.integer(
    "SANDBOX_WORKSPACE_MB",
    128,
    minimum=1,
    help="Total size of a sandbox workspace (a tmpfs; full: EDISK).",
)
CELERY_BEAT_SCHEDULE["sandbox-janitor"] = {
    "task": "runs.tasks.sandbox_janitor_task",
    "schedule": 60.0,
}
SANDBOX_OUTPUT_BYTES = env.integer(
    "SANDBOX_OUTPUT_BYTES", 64_000, minimum=1024, help="Output cap per sandboxed run."
)
SANDBOX_EGRESS_CA_FILE = env.string(
    "SANDBOX_EGRESS_CA_FILE",
    "",
    help="CA bundle the egress proxy verifies upstream TLS against when it adds a "
    "credential itself; empty: the system's CAs.",
)

# MCP servers (runs/mcp): what one server may cost the host.
MCP_MAX_RESPONSE_BYTES = env.integer(
    "MCP_MAX_RESPONSE_BYTES",
    4 * 1024 * 1024,
    minimum=64 * 1024,
    help="Largest response an MCP server may send (a bigger one is refused unread).",
)
MCP_MAX_TOOLS = env.integer(
    "MCP_MAX_TOOLS", 500, minimum=1, help="Most tools one MCP server may list."
)
MCP_LIST_TIMEOUT_SECONDS = env.number(
    "MCP_LIST_TIMEOUT_SECONDS",
    20.0,
    minimum=1.0,
    help="Deadline of an MCP server's tool listing (registration, refresh).",
)
# What a stdio server sees of the host, read-only and on its PYTHONPATH: the
# control plane's own Python packages (the `mcp` SDK among them) and the servers
# shipped with it. Nothing else of the host, no secret, no network by default.
MCP_STDIO_READONLY_PATHS = env.items(
    "MCP_STDIO_READONLY_PATHS",
    ",".join(
        [
            os.path.realpath(sysconfig.get_paths()["purelib"]),
            str(BASE_DIR / "runs" / "mcp" / "servers"),
        ]
    ),
    help="Host directories a sandboxed MCP stdio server may read (on PYTHONPATH).",
)
# Where a stdio server's tools are listed at registration and refresh: "worker"
# (a Celery worker, which may start sandboxes: an unprivileged web process may
# not), "inline" (the process handling the request), or "auto": inline where the
# sandbox can run (a root dev launcher, a management command in the worker's
# image), else a worker.
MCP_STDIO_LIST_IN = env.string(
    "MCP_STDIO_LIST_IN",
    "auto",
    help="'auto', 'worker' or 'inline': which process lists a stdio MCP server's "
    "tools at registration and refresh.",
)
MCP_STDIO_MEMORY_MB = env.integer(
    "MCP_STDIO_MEMORY_MB", 512, minimum=64, help="Memory cap of a stdio MCP server."
)

APPROVAL_DEFAULT_TTL_SECONDS = env.integer(
    "APPROVAL_DEFAULT_TTL_SECONDS",
    24 * 3600,
    minimum=1,
    help="How long an approval request waits before it expires.",
)
APPROVAL_UNDO_SECONDS = env.integer(
    "APPROVAL_UNDO_SECONDS",
    5,
    minimum=1,
    help="How long the inbox holds a one-key decision (with Undo) before it sends it.",
)
APPROVAL_EXPIRE_INTERVAL_SECONDS = env.number(
    "APPROVAL_EXPIRE_INTERVAL_SECONDS",
    30.0,
    minimum=1.0,
    help="How often beat expires pending approvals past their time-to-live.",
)
CELERY_BEAT_SCHEDULE["approvals-expire"] = {
    "task": "runs.tasks.expire_approvals_task",
    "schedule": APPROVAL_EXPIRE_INTERVAL_SECONDS,
}

# Gates of agents that run outside the control plane (docs/external-agents.md).
GATE_MAX_BODY_BYTES = env.integer(
    "GATE_MAX_BODY_BYTES",
    1_048_576,
    minimum=1024,
    help="Largest POST /api/v1/gates/ body (larger: 413, nothing written).",
)
GATE_WAIT_MAX_SECONDS = 60  # the longest long-poll (GET /api/v1/gates/<id>/?wait=)
GATE_WAITERS_MAX = env.integer(
    "GATE_WAITERS_MAX",
    2000,
    minimum=1,
    help="Long-polls one web process holds at once; past it a poll answers at once.",
)
GATE_WEBHOOK_ALLOW_PRIVATE = env.boolean(
    "GATE_WEBHOOK_ALLOW_PRIVATE",
    False,
    help="Let gate webhooks go to private and loopback addresses (tests only).",
)
GATE_WEBHOOK_TIMEOUT_SECONDS = env.number(
    "GATE_WEBHOOK_TIMEOUT_SECONDS",
    10.0,
    minimum=0.1,
    help="Connect and read timeout of one gate webhook delivery.",
)
GATE_WEBHOOK_MAX_ATTEMPTS = env.integer(
    "GATE_WEBHOOK_MAX_ATTEMPTS",
    8,
    minimum=1,
    help="Deliveries of a gate webhook tried before it is given up.",
)
GATE_WEBHOOK_BACKOFF_SECONDS = env.number(
    "GATE_WEBHOOK_BACKOFF_SECONDS",
    5.0,
    minimum=0.0,
    help="First retry delay of a failed gate webhook; doubled per attempt (to 1 h).",
)
GATE_WEBHOOK_SWEEP_INTERVAL_SECONDS = env.number(
    "GATE_WEBHOOK_SWEEP_INTERVAL_SECONDS",
    5.0,
    minimum=1.0,
    help="How often beat enqueues gate webhook deliveries that are due.",
)
CELERY_BEAT_SCHEDULE["gate-webhooks-due"] = {
    "task": "runs.tasks.gate_webhooks_due_task",
    "schedule": GATE_WEBHOOK_SWEEP_INTERVAL_SECONDS,
}

# End users' memory (docs/memory.md): what the `memory` tool may keep per end user.
MEMORY_MAX_ENTRY_CHARS = env.integer(
    "MEMORY_MAX_ENTRY_CHARS",
    2_000,
    minimum=1,
    help="Longest text of one memory entry.",
)
MEMORY_MAX_USER_CHARS = env.integer(
    "MEMORY_MAX_USER_CHARS",
    50_000,
    minimum=1,
    help="Characters of memory kept for one end user, over all their files.",
)
