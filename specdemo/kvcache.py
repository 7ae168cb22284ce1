"""The KV cache the engine keeps between steps: preallocated per layer, compacted in place after each verification.

A verification forward appends the KV entries of the whole tree; only the accepted path stays.  `keep` moves the
accepted entries next to the committed ones without reallocating (an index copy per layer), so a step costs no
allocation however long the answer grows.

Given the model's number of layers, every layer's K and V live in one tensor (`KVCache.joint`), each layer's buffers
views of it laid out as a buffer of their own would be: compaction is then one gather and one scatter for the whole
model instead of four operations per layer (~120 launches on a GPU, ~0.4 ms of small operations on a CPU).

Static shapes (`static_step.py`, what a CUDA graph needs): a cache made with `static=True` never grows and, once the
step points it at a tensor of slots (`write_to`), writes each row's entries at its slot with `index_copy_` and returns
the whole fixed-length buffer; the step's mask hides every slot that is not committed or an ancestor.  Such a buffer
starts zeroed, because a masked slot still enters the attention product with weight 0, and 0 times the NaN that
uninitialised memory may hold is NaN.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


SLOT_BLOCK = 8  # a growing cache's capacity, and the views it hands out in whole blocks, count slots in these


def whole_blocks(slots: int) -> int:
    """`slots` rounded up to whole SLOT_BLOCKs."""
    return -(-slots // SLOT_BLOCK) * SLOT_BLOCK


def _allocator(static: bool, device: torch.device):
    """torch.zeros where slots past the cache's length are read (static steps; the CPU's row-exact attention reads
    whole blocks of keys, cpu_attention.py) and enter an attention product with weight 0, which NaN in uninitialised
    memory would turn into NaN; torch.empty elsewhere."""
    return torch.zeros if static or device.type == "cpu" else torch.empty


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
        self.owner: "KVCache | None" = None  # the cache whose joint tensor holds this layer's buffers, if any
        self.index = 0  # this layer's place in it
        self.joint_backed = False
        self._blocks: tuple[int, tuple[torch.Tensor, torch.Tensor] | None] = (0, None)  # length, (K, V) views

    # `keys` and `values` are the committed entries' views, remade on first read once `length` has moved on
    # (`KVCache.set_length`): a step ends by setting every layer's length, and the next forward's `update` makes its
    # own views anyway, so making 60 views there (~70 µs on the 2-core dev CPU, ~0.6% of an int4 AR step) would be
    # work done twice
    @property
    def keys(self) -> torch.Tensor | None:
        self._follow_length()
        return self._keys

    @keys.setter
    def keys(self, t: torch.Tensor | None) -> None:
        self._keys = t

    @property
    def values(self) -> torch.Tensor | None:
        self._follow_length()
        return self._values

    @values.setter
    def values(self, t: torch.Tensor | None) -> None:
        self._values = t

    def _follow_length(self) -> None:
        if self.is_initialized and (self._keys is None or self._keys.shape[-2] != self.length):
            self._keys, self._values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        views = self.owner.joint_views(self.index, key_states, value_states) if self.owner is not None else None
        self.joint_backed = views is not None
        if views is not None:
            self._k, self._v = views
        else:
            b, h, _, d = key_states.shape
            alloc = _allocator(self.static, key_states.device)
            self._k = alloc(b, h, self.capacity, d, dtype=self.dtype, device=self.device)
            self._v = alloc(b, h, self.capacity, value_states.shape[-1], dtype=self.dtype, device=self.device)
        self._blocks = (0, None)  # the block views (update) of any earlier buffers are stale
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
            self.capacity = whole_blocks(max(end, 2 * self.capacity))
            k, v = self._k, self._v
            self.owner = None  # a buffer of its own from now on: the joint tensor keeps its length
            self.lazy_initialization(key_states, value_states)
            self._k[:, :, : self.length] = k[:, :, : self.length]
            self._v[:, :, : self.length] = v[:, :, : self.length]
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        # the buffers up to the next whole block, handed out with the keys (`keys.blocks`) for the CPU's row-exact
        # attention; the views change once a block, so making them costs nothing per step
        blocks = whole_blocks(end)
        if blocks != self._blocks[0]:
            views = (self._k[:, :, :blocks], self._v[:, :, :blocks]) if blocks <= self.capacity else None
            self._blocks = (blocks, views)
        if self._blocks[1] is not None:
            self.keys.blocks, self.values.blocks = self._blocks[1]
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

    def __init__(self, capacity: int = 256, static: bool = False, layers: int | None = None) -> None:
        super().__init__(layer_class_to_replicate=self._new_layer)
        # whole blocks of slots (SLOT_BLOCK): the CPU's row-exact attention reads keys in such blocks from the buffer
        # itself.  Static shapes keep the length they are given.
        self.capacity, self.static = (capacity if static else whole_blocks(capacity)), static
        self.slots: torch.Tensor | None = None
        self.n_layers = layers  # known: the layers' buffers are views of `joint`
        self.joint: torch.Tensor | None = None  # (layers, 2, batch, kv heads, capacity, head dim)

    def _new_layer(self) -> SlotLayer:
        """Layers appear on their first update (a one-token prompt has no prefill), in order, already pointed at the
        slots."""
        layer = SlotLayer(self.capacity, self.static)
        layer.slots = self.slots
        layer.owner, layer.index = (self, len(self.layers)) if self.n_layers else (None, 0)
        return layer

    def joint_views(self, index: int, key_states: torch.Tensor, value_states: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Layer `index`'s K and V buffers as views of the joint tensor, which the first layer's first update
        allocates; None where a layer's shapes do not fit it (that layer then allocates its own)."""
        b, h, _, d = key_states.shape
        shape = (self.n_layers, 2, b, h, self.capacity, d)
        if value_states.shape[-1] != d or index >= self.n_layers:
            return None
        if self.joint is None:
            alloc = _allocator(self.static, key_states.device)
            self.joint = alloc(shape, dtype=key_states.dtype, device=key_states.device)
        if self.joint.shape != shape or self.joint.dtype != key_states.dtype or self.joint.device != key_states.device:
            return None
        return self.joint[index, 0], self.joint[index, 1]

    def _joint_ready(self) -> bool:
        """Whether every layer's buffers are views of `joint`, so one operation moves entries in all of them."""
        return self.joint is not None and len(self.layers) == self.n_layers and \
            all(layer.is_initialized and layer.joint_backed and layer.owner is self for layer in self.layers)

    def keep(self, start: int, src: list[int]) -> None:
        """Keep the entries at absolute indices `src` (increasing), moved to start.., in every layer; drop the rest."""
        if not src:  # nothing moves (an AR step, a drafter dropping its draft rows)
            self.set_length(start)
            return
        idx = torch.tensor(src, dtype=torch.long)
        if self._joint_ready():
            self.joint[:, :, :, :, start : start + len(src)] = self.joint[:, :, :, :, idx.to(self.joint.device)]
            self.set_length(start + len(src))
            return
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
        if self._joint_ready():
            self.joint.index_copy_(4, dst, self.joint.index_select(4, src))
        else:
            for layer in self.layers:
                layer.move(dst, src)
        self.set_length(length)

    def set_length(self, length: int) -> None:
        """The first `length` slots hold the committed entries (host bookkeeping: a static forward does not count)."""
        for layer in self.layers:
            layer.length = length  # its views follow when read (SlotLayer.keys)
