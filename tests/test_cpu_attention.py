"""The CPU's row-exact attention: every tree row gets the bits a one-token step at its position gets."""
from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

from specdemo import cpu_attention
from specdemo.cpu_attention import row_exact_sdpa
from specdemo.kvcache import KVCache
from specdemo.tree import DraftTree, TreeBuffers, additive_mask, ancestor_mask, path_to


class _Heads(torch.nn.Module):
    num_key_value_groups = 3


def _tree_mask(parents: list[int], past: int) -> torch.Tensor:
    """The engine's mask for rows whose parents are `parents` (row 0 the root), after `past` cached positions."""
    return additive_mask(ancestor_mask(parents), past, torch.float32)


def _cached(keys: torch.Tensor, values: torch.Tensor, room: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """keys/values (1, kv heads, length, dim) as the engine's KV cache hands them to the attention function, in a
    buffer with at least `room` more slots, filled with what earlier steps might have left there (the attention reads
    whole blocks of keys: the cache's own views of them, or padded copies)."""
    cache = KVCache(capacity=keys.shape[2] + room)
    k, v = cache.update(keys, values, 0)
    layer = cache.layers[0]
    layer._k[:, :, keys.shape[2]:] = 100 * torch.randn_like(layer._k[:, :, keys.shape[2]:])
    layer._v[:, :, keys.shape[2]:] = torch.randn_like(layer._v[:, :, keys.shape[2]:])
    if room == 0:  # a tensor that is not the cache's (no block views): padded copies
        k, v = k.clone(), v.clone()
    return k, v


@torch.no_grad()
@pytest.mark.parametrize("form", ["as-this-machine-allows", "batched", "one-call-per-row"])
@pytest.mark.parametrize("seed", range(4))
def test_every_tree_row_equals_a_one_token_step_bit_for_bit(seed, form, monkeypatch):
    """Random trees (chains, side branches, root-only) after random context lengths (some crossing a key block), from
    the cache's block views and from padded copies: each row's output equals the one-token call over its own context
    and ancestors, bitwise; a kernel whose result for a row depends on the other rows, on how many keys are masked or
    on what lies behind the keys fails this.  Every way of calling the kernel for a path's rows: their queries stacked
    in one call (`rows_stack_exactly`) or in batches (`batches_are_exact`) where this machine's kernel keeps their
    bits, and one call per row."""
    if form != "as-this-machine-allows":
        monkeypatch.setattr(cpu_attention, "rows_stack_exactly", lambda *shape: False)
    if form == "one-call-per-row":
        monkeypatch.setattr(cpu_attention, "batches_are_exact", lambda *shape: False)
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for _ in range(12):
        past, n = rng.randint(1, 700), rng.randint(1, 20)
        parents = [-1] + [rng.randrange(i) if rng.random() < 0.5 else i - 1 for i in range(1, n)]
        q = torch.randn(1, 9, n, 64)
        keys, values = torch.randn(1, 3, past + n, 64), torch.randn(1, 3, past + n, 64)
        k, v = _cached(keys, values, room=rng.choice([0, 1, 64, 200]))
        tree, _ = row_exact_sdpa(_Heads(), q, k, v, _tree_mask(parents, past), scaling=0.125)
        assert torch.equal(k, keys) and torch.equal(v, values)  # the tree's entries are back where they were
        for i in range(n):
            idx = torch.tensor(list(range(past)) + [past + j for j in path_to(parents, i)])
            k1, v1 = _cached(keys[:, :, idx], values[:, :, idx], room=rng.choice([0, 3, 64, 200]))
            one, _ = row_exact_sdpa(_Heads(), q[:, :, i : i + 1], k1, v1, None, scaling=0.125)
            assert torch.equal(one[0, 0], tree[0, i]), (past, parents, i)


@torch.no_grad()
@pytest.mark.parametrize("past, per_head", [(100, 1), (300, 3)])
def test_row_exact_attention_is_attention(past, per_head):
    """The same values as torch's attention, to float rounding (a tree row sees context, ancestors and itself), in
    both forms of the exact call: one query per head, and from GROUPED_FROM keys a key head's three query heads as
    its query rows."""
    assert cpu_attention._query_rows(9, 3, past) == per_head
    torch.manual_seed(0)
    parents = [-1, 0, 0, 1, 2]
    q = torch.randn(1, 9, 5, 64)
    keys, values = torch.randn(1, 3, past + 5, 64), torch.randn(1, 3, past + 5, 64)
    mask = _tree_mask(parents, past)
    k, v = _cached(keys, values)
    got, _ = row_exact_sdpa(_Heads(), q, k, v, mask, scaling=0.125)
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=0.125,
                                                            enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("seed", range(3))
def test_probe_rows_are_attention_and_leave_the_real_rows_exact(seed):
    """Trees with SDSAT-style probe chains (the last rows, marked on the engine's mask): every real row still equals its
    one-token call bitwise, the probe rows equal torch's masked attention to float rounding, the cache is left as it
    was; probes in the middle of a tree (not marked) go the exact way like any row."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    for _ in range(8):
        past, n_real, n_probe = rng.randint(1, 400), rng.randint(1, 6), rng.randint(1, 6)
        parents = [-1] + [rng.randrange(i) if rng.random() < 0.5 else i - 1 for i in range(1, n_real)]
        probe_parents = [rng.randrange(-1, n_real - 1)]  # hung under the root or a real node (tree indices)
        probe_parents += [n_real - 1 + j for j in range(n_probe - 1)]  # then a chain
        tree = DraftTree(list(range(n_real - 1 + n_probe)), [p - 1 for p in parents[1:]] + probe_parents,
                         probe=[False] * (n_real - 1) + [True] * n_probe)
        buf = TreeBuffers.build(tree, past)
        n = buf.n
        mask = buf.attention_mask(past, torch.float32)
        assert mask.probes_from == n_real
        q = torch.randn(1, 9, n, 64)
        keys, values = torch.randn(1, 3, past + n, 64), torch.randn(1, 3, past + n, 64)
        k, v = _cached(keys, values, room=rng.choice([0, 64]))
        got, _ = row_exact_sdpa(_Heads(), q, k, v, mask, scaling=0.125)
        assert torch.equal(k, keys) and torch.equal(v, values)
        exact, _ = row_exact_sdpa(_Heads(), q, keys.clone(), values.clone(), additive_mask(buf.mask, past, torch.float32),
                                  scaling=0.125)  # the same tree unmarked: every row its one-token bits
        assert torch.equal(got[0, :n_real], exact[0, :n_real])
        torch.testing.assert_close(got[0, n_real:], exact[0, n_real:], atol=1e-5, rtol=1e-5)
    middle = DraftTree([1, 2, 3], [-1, -1, 1], probe=[True, False, False])
    assert TreeBuffers.build(middle, 5).attention_mask(5, torch.float32).probes_from is None


def test_importing_specdemo_makes_batched_rows_exact():
    """specdemo asks MKL for reproducible results before anything calls it (MKL_CBWR), so the flash kernel gives a
    query the same bits on every thread and a path's rows can share one call at 2 threads (the test suite's count);
    a user's own MKL_CBWR is left alone."""
    code = ("import specdemo, os, torch; from specdemo.cpu_attention import batches_are_exact; "
            "torch.set_num_threads(2); print(os.environ['MKL_CBWR'], batches_are_exact(2, 9, 1, 64, 3))")
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["AUTO,STRICT", "True"]
    env["MKL_CBWR"] = "COMPATIBLE"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "COMPATIBLE"


@torch.no_grad()
def test_stacked_rows_keep_their_one_token_bits_where_the_check_says_so():
    """`rows_stack_exactly` is a real check: on this machine's kernel it agrees with a direct comparison of stacked
    rows against their one-token calls in both forms of the call (below and from GROUPED_FROM keys), and a tree's
    rows take the stacked form only where it holds (the forms give the same values to float rounding either way)."""
    torch.manual_seed(3)
    holds = cpu_attention.rows_stack_exactly(torch.get_num_threads(), 9, 1, 64, 3)
    same = True
    for length in (40, 304):
        k, v = torch.randn(1, 3, length, 64), torch.randn(1, 3, length, 64)
        q = torch.randn(5, 9, 1, 64)
        mask = torch.cat([cpu_attention._tail_mask(length - 4 + i, length, torch.float32) for i in range(5)])
        call = cpu_attention._KeyBlockCall(list(range(5)), length, mask, slice(0, 5))
        got = cpu_attention._stacked_call(q, k, v, call, 0.125)
        ones = torch.cat([cpu_attention._exact_call(q[i : i + 1], k, v, mask[i : i + 1], 0.125) for i in range(5)])
        torch.testing.assert_close(got, ones, atol=1e-6, rtol=1e-6)
        same &= torch.equal(got, ones)
    assert same or not holds

