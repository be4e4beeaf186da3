"""One module per ``lld-monitor`` subcommand, each with ``add_arguments`` and ``run``."""
