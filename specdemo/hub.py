"""Whether the Hugging Face hub answers here, asked at most once a minute with a 3-second limit, so that a hub id is
read from the local cache at once where the hub cannot be reached.

Why: offline or behind a firewall, huggingface_hub retries every request five times with growing pauses, and loading
a model makes two such requests (tokenizer, weights): a hub id typed into the page kept it silent for ~47 s before
its message on the 2-core dev machine without a network.  Loads that pass `local_files_only=local_only()` read the
cache instead — a model downloaded earlier still loads — and fail at once with the loader's own message otherwise.
Where the hub answers, nothing changes: the first load of a minute pays one HEAD request.
"""
from __future__ import annotations

import time
from functools import lru_cache

PROBE_TIMEOUT_S = 3.0  # a hub that has not answered by then is not one a page should wait for
PROBE_EVERY_S = 60  # a network that comes back is noticed within a minute


def local_only() -> bool:
    """True when hub files should come from the local cache only: huggingface_hub is offline (HF_HUB_OFFLINE, as the
    library itself read it), or the hub's endpoint did not answer the last probe (made at most once a minute)."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or not _answers(int(time.monotonic() // PROBE_EVERY_S))


@lru_cache(maxsize=1)
def _answers(_minute: int) -> bool:
    """One HEAD request to the hub's endpoint (HF_ENDPOINT or huggingface.co), through huggingface_hub's own session
    (its proxies and headers); any answer, even an error status, means the hub is there."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 -- no name, no route, refused, timed out: all mean the hub is not there for us
        return False
    return True
