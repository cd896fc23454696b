"""`python -m controlplane_client eval run ...`: the console script's command."""

import sys

from controlplane_client.cli import main

sys.exit(main())
