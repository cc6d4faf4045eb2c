"""Prefect flows: wiring only."""
