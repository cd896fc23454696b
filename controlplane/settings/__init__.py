"""Settings for the control plane, read from the environment.

Every default runs on a laptop: SQLite, an embedded Redis started by
`manage.py dev`, DEBUG on. Production differs only by environment variables.
Each module holds one area; this one composes them (later modules add to the
registries earlier ones define: the beat schedule, demo seeders, collectors).
"""

from controlplane.environment import env
from controlplane.settings.base import *  # noqa: F403
from controlplane.settings.broker import *  # noqa: F403
from controlplane.settings.budgets import *  # noqa: F403
from controlplane.settings.database import *  # noqa: F403
from controlplane.settings.runs import *  # noqa: F403
from controlplane.settings.secret_store import *  # noqa: F403
from controlplane.settings.telemetry import *  # noqa: F403
from controlplane.settings.tracing import *  # noqa: F403

# Every variable read above, and every malformed one (controlplane.checks).
ENV_PROBLEMS = env.problems
ENV_VARIABLES = env.variables
