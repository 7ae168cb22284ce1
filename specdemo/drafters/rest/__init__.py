"""REST: drafts retrieved from a datastore (datastore.py: the on-disk format and its lookup; drafter.py: the trie and tree)."""
from specdemo.drafters.rest.drafter import KNOBS, make, unavailable_reason

__all__ = ["KNOBS", "make", "unavailable_reason"]
