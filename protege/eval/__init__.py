"""Evaluation: benchmark scoring and reports."""
