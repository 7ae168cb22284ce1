"""The KV cache the engine keeps between steps: preallocated per layer, compacted in place after each verification.

A verification forward appends the KV entries of the whole tree; only the accepted path stays.  `keep` moves the
accepted entries next to the committed ones without reallocating (an index copy per layer), so a step costs no
allocation however long the answer grows.

Static shapes (`static_step.py`, what a CUDA graph needs): a cache made with `static=True` never grows and, once the
step points it at a tensor of slots (`write_to`), writes each row's entries at its slot with `index_copy_` and returns
the whole fixed-length buffer; the step's mask hides every slot that is not committed or an ancestor.  Such a buffer
starts zeroed, because a masked slot still enters the attention product with weight 0, and 0 times the NaN that
uninitialised memory may hold is NaN.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class SlotLayer(DynamicLayer):
    """One layer's KV cache in a preallocated buffer: writes in place, returns views, compacts after acceptance.

    HF's DynamicLayer grows by torch.cat every step (~20% of a CPU step on the embedded model); this never copies
    the context, only the accepted path's few entries.
    """

    def __init__(self, capacity: int = 256, static: bool = False) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self.static = static
        self.slots: torch.Tensor | None = None  # static shapes: where the next forward's rows go (owned by the step)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        alloc = torch.zeros if self.static else torch.empty
        self._k = alloc(b, h, self.capacity, d, dtype=self.dtype, device=self.device)
        self._v = alloc(b, h, self.capacity, value_states.shape[-1], dtype=self.dtype, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.slots is not None:  # static shapes: no Python-valued shape, no length bookkeeping in the forward
            self._k.index_copy_(2, self.slots, key_states)
            self._v.index_copy_(2, self.slots, value_states)
            return self._k, self._v
        n = key_states.shape[-2]
        end = self.length + n
        if end > self.capacity:  # rare (the engine sizes the capacity per request): grow geometrically
            if self.static:
                raise RuntimeError(f"a static KV cache of {self.capacity} slots cannot take {end} entries")
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

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy the entries at slots `src` to slots `dst` (distinct), all gathered before any is written: compaction
        by index tensors of a fixed size, so it has no Python-valued shape either."""
        if self.is_initialized:
            self._k.index_copy_(2, dst, self._k.index_select(2, src))
            self._v.index_copy_(2, dst, self._v.index_select(2, src))


class KVCache(Cache):
    """A transformers Cache made of SlotLayers (works with any model that takes `past_key_values`).

    static -- a fixed-length cache for static-shape steps (`write_to`, `move`, `set_length`); until `write_to` is
    given slots it appends like the plain cache (the prefill), with zeroed free slots and no growth.
    """

    def __init__(self, capacity: int = 256, static: bool = False) -> None:
        super().__init__(layer_class_to_replicate=self._new_layer)
        self.capacity, self.static = capacity, static
        self.slots: torch.Tensor | None = None

    def _new_layer(self) -> SlotLayer:
        """Layers appear on their first update (a one-token prompt has no prefill), already pointed at the slots."""
        layer = SlotLayer(self.capacity, self.static)
        layer.slots = self.slots
        return layer

    def keep(self, start: int, src: list[int]) -> None:
        """Keep the entries at absolute indices `src` (increasing), moved to start.., in every layer; drop the rest."""
        idx = torch.tensor(src, dtype=torch.long)
        for layer in self.layers:
            layer.keep(start, idx.to(layer._k.device) if layer.is_initialized else idx)

    def write_to(self, slots: torch.Tensor | None) -> None:
        """Static shapes: the next forwards write their rows at `slots` and read the whole buffer (None: append)."""
        if not self.static:
            raise RuntimeError("write_to needs a KVCache made with static=True")
        self.slots = slots
        for layer in self.layers:
            layer.slots = slots

    def move(self, dst: torch.Tensor, src: torch.Tensor, length: int) -> None:
        """Static compaction: copy slots `src` to slots `dst` in every layer; the first `length` slots are then the
        committed entries (what lies beyond is stale, finite and masked until overwritten)."""
        for layer in self.layers:
            layer.move(dst, src)
        self.set_length(length)

    def set_length(self, length: int) -> None:
        """The first `length` slots hold the committed entries (host bookkeeping: a static forward does not count)."""
        for layer in self.layers:
            layer.length = length
            if layer.is_initialized:
                layer.keys, layer.values = layer._k[:, :, :length], layer._v[:, :, :length]
