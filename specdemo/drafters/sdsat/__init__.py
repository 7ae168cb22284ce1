"""SDSAT: semantic adaptive tokens (adapter.py: the LoRA active at adaptive positions; drafter.py: probe chains)."""
from specdemo.drafters.sdsat.drafter import KNOBS, make, note, unavailable_reason

__all__ = ["KNOBS", "make", "unavailable_reason", "note"]
