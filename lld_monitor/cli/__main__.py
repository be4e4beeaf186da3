"""``python -m lld_monitor.cli``: the same as the ``lld-monitor`` command."""

from __future__ import annotations

import sys

from lld_monitor.cli import main

sys.exit(main())
