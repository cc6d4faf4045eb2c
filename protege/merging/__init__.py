"""Checkpoint merging (model soups)."""
