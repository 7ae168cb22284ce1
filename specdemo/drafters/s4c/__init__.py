"""S4C: multi-head autoregressive draft model (heads.py) and its continuous verification tree (drafter.py)."""
from specdemo.drafters.s4c.drafter import KNOBS, OPTIONS, SOURCES, make, unavailable_reason

__all__ = ["KNOBS", "OPTIONS", "SOURCES", "make", "unavailable_reason"]
