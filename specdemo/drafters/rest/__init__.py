"""REST: drafts retrieved from a datastore (datastore.py: the format on disk and its lookup; drafter.py: trie, tree)."""
from specdemo.drafters.rest.drafter import KNOBS, OPTIONS, make, unavailable_reason

__all__ = ["KNOBS", "OPTIONS", "make", "unavailable_reason"]
