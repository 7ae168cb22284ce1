"""S4C: multi-head autoregressive draft model (heads.py), its continuous verification tree (drafter.py) and its
options (mode.py)."""
from specdemo.drafters.s4c.drafter import SOURCES, unavailable_reason
from specdemo.drafters.s4c.mode import KNOBS, OPTIONS, make

__all__ = ["KNOBS", "OPTIONS", "SOURCES", "make", "unavailable_reason"]
