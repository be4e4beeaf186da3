"""``streamlit run dashboard/app.py -- [ROOT | RUN ...]`` from a checkout: the lld_monitor
dashboard, whose page lives in the package (``lld_monitor/report/dashboard/app.py``, what
``lld-monitor dashboard`` runs, in a checkout and in an installed wheel alike)."""

import sys
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # `streamlit run` puts only this folder on the path
    sys.path.insert(0, str(_REPO))

from lld_monitor.report.dashboard.app import main  # noqa: E402

main()
