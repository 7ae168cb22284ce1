"""SDSAT: semantic adaptive tokens (adapter.py: the LoRA active at adaptive positions; drafter.py: probe chains)."""
from specdemo.drafters.sdsat.drafter import (
    KNOBS,
    OPTIONS,
    SOURCES,
    make,
    note,
    unavailable_reason,
)

__all__ = ["KNOBS", "OPTIONS", "SOURCES", "make", "unavailable_reason", "note"]
