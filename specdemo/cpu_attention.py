"""Tree verification's attention on CPU without copying the KV cache per layer.

A tree forward passes a custom 4D mask.  With a mask, transformers' SDPA integration expands grouped KV heads to
one per query head (`repeat_kv`) before calling `scaled_dot_product_attention`, because CUDA's fast kernels refuse
masked grouped-query attention.  On CPU that expansion copies the whole cache of every layer on every verification:
for SmolLM2-135M (9 query heads, 3 KV heads) at a 2,000-token context it is ~10 ms of a ~90 ms step, and the reason a
one-node tree costs 1.3x a plain step there while an unmasked one-token step (which keeps the KV heads grouped) does
not.  torch's CPU flash kernel takes the mask and the grouped heads together (`enable_gqa=True`), with the same
result up to float rounding, so this registers an attention function that does exactly that on CPU and defers to
transformers' own SDPA function everywhere else (GPU, unmasked calls, models without grouped heads).

It is registered through transformers' `AttentionInterface` (its extension point for attention functions) under
NAME, with the SDPA mask format; the model's code is not touched.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdemo.kvcache import SLOT_BLOCK, whole_blocks

NAME = "sdpa_grouped_kv"


def grouped_kv_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: (batch, heads, q, d) inputs -> ((batch, q, heads, d), None)."""
    plain = (query.device.type != "cpu" or attention_mask is None or getattr(module, "num_key_value_groups", 1) == 1
             or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
             or kwargs.get("cache") is not None or attention_mask.dtype == torch.bool)
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_kv_attention(model: torch.nn.Module) -> bool:
    """Switch a loaded CPU model that uses SDPA with grouped KV heads to `grouped_kv_sdpa`; True if switched."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    cfg = model.config
    heads = getattr(cfg, "num_attention_heads", None)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not heads or kv_heads == heads:
        return False
    AttentionInterface.register(NAME, grouped_kv_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return cfg._attn_implementation == NAME


ROW_EXACT = "sdpa_row_exact"


@dataclass
class TreePath:
    """Rows of a tree forward that share one layout of the cache: once the tree entries `src` are moved to the cache
    slots `dst`, each row's ancestors and itself lie right after the context; row `rows[i]` sees the first `seen[i]`
    tree slots."""

    rows: list[int]
    seen: list[int]
    dst: torch.Tensor | None
    src: torch.Tensor | None
    calls: list["_KeyBlockCall"] = field(default_factory=list)


@dataclass
class _KeyBlockCall:
    """Rows of one path whose contexts round up to the same whole key blocks: one batched kernel call."""

    rows: list[int]
    length: int  # keys read, in whole blocks (kvcache.whole_blocks)
    mask: torch.Tensor  # (rows, 1, 1, length): 0 over each row's own keys, -inf after them
    order: torch.Tensor | slice  # the rows' queries, as an index
    stacked_mask: torch.Tensor | None = None  # `mask` as `_stacked_call` hands it over, made on first use


def _index_pair(moves: list[tuple[int, int]], past: int, device: torch.device
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(destination cache slots, source tree entries) as index tensors for tree-relative (slot, entry) moves after
    `past` cached entries; (None, None) for no moves."""
    if not moves:
        return None, None
    dst, src = zip(*moves)
    return torch.tensor(dst, device=device) + past, torch.tensor(src, device=device)


def _tree_plan(mask: torch.Tensor, past: int
               ) -> tuple[list[TreePath], tuple[torch.Tensor | None, torch.Tensor | None]]:
    """The paths of a tree forward, read from the mask once and kept on it (every layer gets the same mask tensor),
    and the moves that put the tree's entries back after them.

    A row sees its ancestors and itself, which must lie right after the context.  Leaves are taken depth first;
    each leaf's path has its entries that are not in place yet moved there, and its rows not computed yet reuse that
    layout.  So a chain moves nothing, and every other path moves once for all its rows."""
    plan = getattr(mask, "_paths", None)
    if plan is not None:
        return plan
    real = _real_rows(mask)  # real rows never hang off probes: they form a tree of their own
    seen = [[j for j, ok in enumerate(row) if ok] for row in (mask[0, 0, :real, past : past + real] == 0).tolist()]
    children: dict[int, list[int]] = {}
    for i, path in enumerate(seen):
        children.setdefault(path[-2] if len(path) > 1 else -1, []).append(i)
    order, stack = [], children[-1][::-1]
    while stack:
        i = stack.pop()
        order.append(i)
        stack += children.get(i, [])[::-1]
    layout = list(range(len(seen)))  # which tree entry sits at each slot now
    done, paths = set(), []
    for leaf in (i for i in order if i not in children):
        moves = [(m, s) for m, s in enumerate(seen[leaf]) if layout[m] != s]
        for m, s in moves:
            layout[m] = s
        rows = [r for r in seen[leaf] if r not in done]
        done.update(rows)
        path = TreePath(rows, [len(seen[r]) for r in rows], *_index_pair(moves, past, mask.device))
        path.calls = _block_calls(path, past, mask.dtype, mask.device)
        paths.append(path)
    mask._paths = plan = (paths, _index_pair([(m, m) for m, s in enumerate(layout) if s != m], past, mask.device))
    return plan


def _real_rows(mask: torch.Tensor) -> int:
    """How many of a tree forward's first rows are not probes (tree.TreeBuffers.attention_mask marks them)."""
    return getattr(mask, "probes_from", None) or mask.shape[2]


def _block_calls(path: TreePath, past: int, dtype: torch.dtype, device: torch.device) -> list[_KeyBlockCall]:
    """The path's rows grouped by the key blocks their contexts fill, each group with its masks."""
    groups: dict[int, list[int]] = {}
    for i, seen in enumerate(path.seen):
        groups.setdefault(whole_blocks(past + seen), []).append(i)
    calls = []
    for length, members in groups.items():
        rows = [path.rows[i] for i in members]
        mask = torch.cat([_tail_mask(past + path.seen[i], length, dtype) for i in members]).to(device)
        run = rows == list(range(rows[0], rows[0] + len(rows)))
        calls.append(_KeyBlockCall(rows, length, mask, slice(rows[0], rows[0] + len(rows)) if run else
                                   torch.tensor(rows, device=device)))
    return calls


@lru_cache(maxsize=16)
def _tail_mask(valid: int, length: int, dtype: torch.dtype, rows: int = 1) -> torch.Tensor:
    """(1, 1, rows, length) additive mask on the CPU, every row the same: the first `valid` keys seen, the block's
    rest not."""
    mask = torch.full((1, 1, 1, length), float("-inf"), dtype=dtype)
    mask[..., :valid] = 0
    return mask.expand(1, 1, rows, length)


def _block_keys(t: torch.Tensor, length: int) -> torch.Tensor:
    """`t` (batch, heads, keys, dim) read as `length` >= its keys: from the engine's cache, the view of its buffer in
    whole blocks that it hands out with the keys (`SlotLayer.update`: `t.blocks`; the slots start zeroed); else a copy
    padded with zeros.  What lies after the keys is masked and enters with weight exactly 0."""
    n = t.shape[2]
    if n >= length:
        return t[:, :, :length]
    blocks = getattr(t, "blocks", None)
    if blocks is not None and blocks.shape[2] >= length:
        return blocks if blocks.shape[2] == length else blocks[:, :, :length]
    padded = t.new_zeros(*t.shape[:2], length, t.shape[3])
    padded[:, :, :n] = t
    return padded


def row_exact_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention in which a tree row computes exactly what a one-token step at its position computes.

    Why: at bf16 and int4 precision every linear rounds its input to bf16, so the last-bit differences between a
    masked multi-row attention and a one-token one (the kernel blocks and sums the keys differently) grow into changes
    that flip near-ties, and the drafted output parts from plain decoding.  Here every verification row makes the
    very call a one-token step makes: one query over the contiguous keys of its own context.  The rows of a
    root-to-leaf path share one layout of the cache (`_tree_plan`: a side branch's entries moved right after the
    context once per path), and the tree's own entries are put back afterwards.  Probe rows (SDSAT's adaptive tokens,
    the last rows where `tree.TreeBuffers.attention_mask` marks them) are never accepted and their outputs only draft,
    so they need no one-token bits: they go through one masked call over every key, before the moves.

    Every call reads its keys in whole blocks (`kvcache.SLOT_BLOCK`), the keys past a row's own masked, so the rows of
    a path whose contexts fill the same blocks can share one call and keep the bits of their one-token calls, which
    read the same blocks (`_block_call`: stacked as query rows, or as a batch, where this machine's kernel allows).
    From GROUPED_FROM keys on, every such call, a one-token step's included, hands the kernel a row's query heads as
    rows of the key head they share (`_exact_call`): a key head read once per row, not once per query head
    (docs/precision.md; tests/test_cpu_attention.py checks the bits)."""
    n, total = query.shape[2], key.shape[2]
    past = total - n
    if getattr(module, "prefilling", False) and past == 0 and attention_mask is None and n > 1:
        return _bf16_prefill(query, key, value, scaling), None
    if query.device.type != "cpu" or past <= 0 or (attention_mask is None and n > 1) or kwargs.get("cache") is not None:
        return grouped_kv_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               is_causal=is_causal, **kwargs)
    if attention_mask is None:  # a one-token step: the call every tree row repeats
        keys, values = getattr(key, "blocks", None), getattr(value, "blocks", None)  # the cache's, when it has room
        if keys is None or values is None:
            keys, values = _block_keys(key, whole_blocks(total)), _block_keys(value, whole_blocks(total))
        mask = _tail_mask(total, keys.shape[2], query.dtype, _query_rows(query.shape[1], *keys.shape[1:3]))
        return _exact_call(query, keys, values, mask, scaling).transpose(1, 2), None
    paths, (dst, src) = _tree_plan(attention_mask, past)
    real = _real_rows(attention_mask)
    rows_first = query[0].transpose(0, 1).unsqueeze(2)  # (rows, heads, 1, dim): each row a batch of its own
    if real == n and len(paths) == 1 and len(paths[0].calls) == 1:  # a chain in one call (no moves): its output
        return _block_call(rows_first, key, value, paths[0].calls[0], scaling)[:, :, 0].unsqueeze(0), None
    out = torch.empty(query.shape[0], n, query.shape[1], value.shape[-1], dtype=query.dtype, device=query.device)
    if real < n:  # probe rows only draft, so they need no one-token bits: one call over every key, before any move
        probe_masks = attention_mask[0, :, real:].transpose(0, 1).unsqueeze(1)  # (probes, 1, 1, keys)
        out[0, real:] = _exact_call(rows_first[real:], key, value, probe_masks, scaling)[:, :, 0]
    if any(p.dst is not None for p in paths):  # the tree's own entries, the source of every move
        tree_k, tree_v = key[:, :, past:].clone(), value[:, :, past:].clone()
    for p in paths:
        if p.dst is not None:
            key.index_copy_(2, p.dst, tree_k.index_select(2, p.src))
            value.index_copy_(2, p.dst, tree_v.index_select(2, p.src))
        for call in p.calls:
            got = _block_call(rows_first, key, value, call, scaling)[:, :, 0]
            if isinstance(call.order, slice):
                out[0, call.order] = got
            else:
                out[0].index_copy_(0, call.order, got)
    if dst is not None:
        key.index_copy_(2, dst, tree_k.index_select(2, src))
        value.index_copy_(2, dst, tree_v.index_select(2, src))
    return out, None


def _block_call(rows_first: torch.Tensor, key: torch.Tensor, value: torch.Tensor, call: _KeyBlockCall,
                scaling: float | None) -> torch.Tensor:
    """`call`'s rows (queries `rows_first`: one batch entry per row) over the keys in its whole blocks, in the
    cheapest form this machine's kernel gives them the bits of their one-row calls in: the rows' queries side by side
    in one (batch, head) per head (`_stacked_call`, where `rows_stack_exactly`), the rows as a batch over the keys
    shared by `expand` (where `batches_are_exact`), else one call per row; (rows, heads, 1, dim)."""
    keys, values = _block_keys(key, call.length), _block_keys(value, call.length)
    queries, rows = rows_first[call.order], len(call.rows)
    shape = (torch.get_num_threads(), *queries.shape[1:], keys.shape[1])
    if rows > 1 and rows_stack_exactly(*shape):
        return _stacked_call(queries, keys, values, call, scaling)
    if rows == 1 or batches_are_exact(*shape):
        return _exact_call(queries, keys, values, call.mask, scaling)
    return torch.cat([_exact_call(queries[i : i + 1], keys, values, call.mask[i : i + 1], scaling)
                      for i in range(rows)])


def _stacked_call(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, call: _KeyBlockCall,
                  scaling: float | None) -> torch.Tensor:
    """`call`'s rows in one kernel call whose (batch, head) pairs are `_exact_call`'s, each holding every row's
    queries for that head side by side, each query row masked to its own row's keys; (rows, heads, 1, dim).

    Why: the batch form reads the keys once per row and head, and at bf16 and int4 the keys and values come cold
    into a step (the weights stream through the caches between one step's attention call and the next's): a
    three-node chain over 256 keys took 160 µs a layer that way and 117 µs this way, 266 against 155 µs over 704 keys
    (2-core Intel Xeon, caches flushed, a one-off timing).  The flash kernel computes each query row of a (batch,
    head) on its own, so a row keeps the bits of its one-token call, where the same row stands alone or with that
    head's other query heads (`rows_stack_exactly` checks it on this machine)."""
    rows, heads, _, dim = queries.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    per_head = _query_rows(heads, kv_heads, length)
    if call.stacked_mask is None:  # the plan, and so the call, serves every layer of the step
        mask = call.mask.reshape(rows, 1, length).expand(rows, per_head, length)
        call.stacked_mask = mask.reshape(1, 1, rows * per_head, length).contiguous()
    if per_head == 1:  # one query per head: the rows are the query rows of each head
        out = F.scaled_dot_product_attention(queries.transpose(0, 2), keys, values, attn_mask=call.stacked_mask,
                                             scale=scaling, enable_gqa=True)
        return out.transpose(0, 2)
    stacked = queries.reshape(rows, kv_heads, per_head, dim).transpose(0, 1).reshape(1, kv_heads, rows * per_head, dim)
    out = F.scaled_dot_product_attention(stacked, keys, values, attn_mask=call.stacked_mask, scale=scaling)
    return out.reshape(kv_heads, rows, per_head, dim).transpose(0, 1).reshape(rows, heads, 1, dim)


def _exact_call(queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                scaling: float | None) -> torch.Tensor:
    """One-token queries (rows, heads, 1, dim) with their masks (rows, 1, 1 or `_query_rows`, keys) over the same keys
    (1, kv heads, keys, dim): one kernel call in the form `_query_rows` picks for this many keys; (rows, heads, 1,
    dim).  A row's bits depend on the form and on how many queries the kernel sees per (batch, head), never on the
    other rows, and a tree row reads as many keys as its one-token call: so both make this call alike."""
    rows, heads, _, dim = queries.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    per_head = _query_rows(heads, kv_heads, length)
    if rows > 1:
        keys, values = keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1)
    if mask.shape[2] != per_head:
        mask = mask.expand(rows, 1, per_head, length)
    if per_head == 1:
        return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scaling, enable_gqa=True)
    out = F.scaled_dot_product_attention(queries.reshape(rows, kv_heads, per_head, dim), keys, values,
                                         attn_mask=mask, scale=scaling)
    return out.reshape(rows, heads, 1, dim)


GROUPED_FROM = 128  # keys from which a row's query heads go in as rows of their shared key heads


def _query_rows(heads: int, kv_heads: int, length: int) -> int:
    """Query rows per (batch, head) of an exact call: from GROUPED_FROM keys, each key head's query heads (views, no
    copy), so the kernel reads a key head once for all of them instead of once per query head; below, one query per
    head, where the grouped form's copy of the output costs what it saves.  On the 2-core Xeon (9 query heads, 3 key
    heads; caches warm, a one-token call with its output copy): 64 keys 11.5 against 11.8 µs, 128 keys 13.2 against
    18.3, 304 keys 19.9 against 27.1; four rows over 304 keys 40 against 84 (one-off timings)."""
    return heads // kv_heads if length >= GROUPED_FROM else 1


@lru_cache(maxsize=16)
def batches_are_exact(threads: int, heads: int, queries: int, dim: int, kv_heads: int) -> bool:
    """Whether torch's CPU flash kernel, at `threads` threads, gives every row of a batch over shared keys the bits
    of its own one-token call (`_exact_call`, in either of its forms).  The kernel hands the (batch, head) pairs to
    the threads in order, each thread with its own scratch buffer, and multiplies through MKL: where MKL's code path
    depends on a buffer's alignment (the 2-core AMD EPYC with AVX-512 bf16, unless MKL_CBWR asks for reproducible
    results, which `specdemo` sets at import), a pair computed by another thread than in its one-token call gets other
    last bits; elsewhere (the 2-core Intel Xeon with AMX) it never did.  Checked once per thread count and shape on
    random queries over several key lengths with masked tails, as a step's calls are, in every batch size a call can
    have (a call's rows fill the same key blocks, so there are at most SLOT_BLOCK of them)."""
    def tails(rows: int, length: int) -> torch.Tensor:  # the first row sees every key, the others all but 3
        mask = torch.zeros(rows, 1, 1, length)
        mask[1:, ..., length - 3 :] = float("-inf")
        return mask

    return _rows_keep_their_bits(lambda q, k, v, mask: _exact_call(q, k, v, mask, None), tails,
                                 (heads, queries, dim, kv_heads), seed=0)


@lru_cache(maxsize=16)
def rows_stack_exactly(threads: int, heads: int, queries: int, dim: int, kv_heads: int) -> bool:
    """Whether torch's CPU flash kernel, at `threads` threads, gives each row of `_stacked_call` the bits of its own
    one-token call (`_exact_call`), in both forms (one query per head, and a key head's query heads as its rows).
    The kernel multiplies a (batch, head)'s query rows as one matrix; where its product's result for a row depended
    on how many rows stand beside it, this would fail and the rows keep the batch form.  Checked once per thread count
    and shape on random queries over key lengths of both forms with masked tails, as a step's calls are, in every
    number of rows a call can have."""
    def tails(rows: int, length: int) -> torch.Tensor:  # every row its own number of keys, as along a chain
        return torch.cat([_tail_mask(length - rows + 1 + i, length, torch.float32) for i in range(rows)])

    def stacked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return _stacked_call(q, k, v, _KeyBlockCall(list(range(len(q))), k.shape[2], mask, slice(0, len(q))), None)

    return queries == 1 and _rows_keep_their_bits(stacked, tails, (heads, queries, dim, kv_heads), seed=1)


def _rows_keep_their_bits(form, masks, shape: tuple[int, int, int, int], seed: int) -> bool:
    """Whether `form(q, k, v, mask)`, a call for rows (rows, heads, queries, dim) over shared keys, gives every row
    the bits of its own one-token call (`_exact_call`), on random data over key lengths of both call forms (below and
    from GROUPED_FROM keys) and every number of rows a call can have (at most SLOT_BLOCK: a call's rows fill the same
    key blocks), each with the masks `masks(rows, length)`.  `shape`: (heads, queries, dim, kv heads)."""
    heads, queries, dim, kv_heads = shape
    g = torch.Generator().manual_seed(seed)
    for length in (8, 64, 680, 2056):
        k, v = (torch.randn(1, kv_heads, length, dim, generator=g) for _ in range(2))
        for rows in range(2, SLOT_BLOCK + 1):
            q = torch.randn(rows, heads, queries, dim, generator=g)
            mask = masks(rows, length)
            got = form(q, k, v, mask)
            if any(not torch.equal(got[i : i + 1], _exact_call(q[i : i + 1], k, v, mask[i : i + 1], None))
                   for i in range(rows)):
                return False
    return True


def _bf16_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """A prompt's causal attention at bf16 and int4 precision, in bf16 (`precision.prefill_weights` marks the layers).
    Why: on a long prompt the fp32 flash kernel is the largest part of the prefill (43% of a 1,000-token int4 prefill
    on the 2-core dev machine, 6.3 ms a layer) and bf16 takes half that on native bf16; the inputs come from bf16
    products and the output feeds one (its input rounded to bf16), so little precision is lost, and every mode
    prefills the same way, so drafted output stays plain decoding's."""
    out = F.scaled_dot_product_attention(query.to(torch.bfloat16), key.to(torch.bfloat16), value.to(torch.bfloat16),
                                         is_causal=True, scale=scaling, enable_gqa=True)
    return out.to(query.dtype).transpose(1, 2).contiguous()


def use_row_exact_attention(model: torch.nn.Module) -> bool:
    """Switch a loaded CPU model to `row_exact_sdpa` (precision.py does, for bf16 and int4); True if switched."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    AttentionInterface.register(ROW_EXACT, row_exact_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ROW_EXACT, sdpa_mask)
    model.set_attn_implementation(ROW_EXACT)
    return model.config._attn_implementation == ROW_EXACT
