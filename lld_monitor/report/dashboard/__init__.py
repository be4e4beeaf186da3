"""The lld_monitor Streamlit dashboard: ``app.py`` is the page, the other modules its helpers.

The helpers read runs only through ``lld_monitor.runlog``, ``lld_monitor.importers`` and
``lld_monitor.analysis``, do no metric math of their own and never import torch.
"""
