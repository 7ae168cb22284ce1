"""REST: drafts retrieved from a datastore (datastore.py: the format on disk and its lookup; build.py: building one;
drafter.py: trie, tree)."""
from specdemo.drafters.rest.drafter import KNOBS, OPTIONS, SOURCES, make, unavailable_reason

__all__ = ["KNOBS", "OPTIONS", "SOURCES", "make", "unavailable_reason"]
