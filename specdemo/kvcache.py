"""The KV cache the engine keeps between steps: preallocated per layer, compacted in place after each verification.

A verification forward appends the KV entries of the whole tree; only the accepted path stays.  `keep` moves the
accepted entries next to the committed ones without reallocating (an index copy per layer), so a step costs no
allocation however long the answer grows.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SlotLayer(DynamicLayer):
    """One layer's KV cache in a preallocated buffer: writes in place, returns views, compacts after acceptance.

    HF's DynamicLayer grows by torch.cat every step (~20% of a CPU step on the embedded model); this never copies
    the context, only the accepted path's few entries.
    """

    def __init__(self, capacity: int = 256) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self._k = torch.empty(b, h, self.capacity, d, dtype=self.dtype, device=self.device)
        self._v = torch.empty(b, h, self.capacity, value_states.shape[-1], dtype=self.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        end = self.length + n
        if end > self.capacity:  # rare (the engine sizes the capacity per request): grow geometrically
            self.capacity = max(end, 2 * self.capacity)
            k, v = self._k, self._v
            self.lazy_initialization(key_states, value_states)
            self._k[:, :, : self.length] = k[:, :, : self.length]
            self._v[:, :, : self.length] = v[:, :, : self.length]
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def keep(self, start: int, src: torch.Tensor) -> None:
        """Move entries `src` (absolute indices, increasing, each >= its destination) to start.. and drop the rest."""
        if self.is_initialized and len(src):
            self._k[:, :, start : start + len(src)] = self._k[:, :, src]
            self._v[:, :, start : start + len(src)] = self._v[:, :, src]
        self.length = start + len(src)
        if self.is_initialized:
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]


class KVCache(Cache):
    """A transformers Cache made of SlotLayers (works with any model that takes `past_key_values`)."""

    def __init__(self, capacity: int = 256) -> None:
        super().__init__(layer_class_to_replicate=lambda: SlotLayer(capacity))

    def keep(self, start: int, src: list[int]) -> None:
        """Keep the entries at absolute indices `src` (increasing), moved to start.., in every layer; drop the rest."""
        idx = torch.tensor(src, dtype=torch.long)
        for layer in self.layers:
            layer.keep(start, idx.to(layer._k.device) if layer.is_initialized else idx)
