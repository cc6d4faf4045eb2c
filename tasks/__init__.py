"""Prefect tasks: thin wrappers that call protege and return paths."""
