"""``python -m hvd_agents.cli``: the ``hvd-agents`` command line."""

import sys

from hvd_agents.cli import main

sys.exit(main())
