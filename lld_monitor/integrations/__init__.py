"""Adapters: the only modules that import a trainer (trl, transformers, verl)."""
