"""Dagster definitions by concept: ``assets/``, ``automation.py``, ``resources.py``."""
