"""The on-disk store of S4C's target features: what it keeps equals the target's features, a second run computes
nothing, a new record adds a part of its own, and an interrupted part is computed again."""
from __future__ import annotations

import torch

from specdemo.offline.feature_store import FeatureStore, extract, record_key, window_of
from specdemo.target import decoder_features


def _records(n: int, seed: int = 0) -> list[dict]:
    rng = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(10, 60, (1,), generator=rng))
        ids = torch.randint(100, 400, (length,), generator=rng).tolist()
        out.append({"id": f"r{i}", "ids": ids, "start": int(torch.randint(2, length - 4, (1,), generator=rng))})
    return out


def test_stored_windows_equal_the_targets_features_of_each_record_alone(tiny_llama, tmp_path):
    """Records of different lengths, computed in padded batches, keep the features a forward over the whole record
    alone gives at the window's positions (up to 20 prompt tokens before the answer, 32 rows in all), last layer and
    a declared layer side by side."""
    t, d = tiny_llama, tiny_llama.model.config.hidden_size
    records = _records(9)
    store = FeatureStore(tmp_path / "s", max_prompt=20, max_len=32)
    extract(t, records, store, layers=(1,), log=lambda m: None, batch_tokens=128, part_records=4)
    assert len(store) == 9 and store.parts == {0, 1, 2}
    for r in records:
        s, n, answer = window_of(r, 20, 32)
        assert answer == min(r["start"], 20) and n == min(len(r["ids"]) - s, 32)
        with torch.no_grad():
            full = decoder_features(t.decoder(input_ids=torch.tensor([r["ids"]]), output_hidden_states=True), (1,))
        got = store.window(r)
        assert got.dtype == torch.float16 and got.shape == (n, 2 * d)
        torch.testing.assert_close(got.float(), full[s : s + n].half().float(), rtol=2e-3, atol=2e-3)


def test_a_second_run_computes_nothing_and_new_records_get_a_part_of_their_own(tiny_llama, tmp_path):
    records = _records(6)
    logs: list[str] = []
    store = FeatureStore(tmp_path / "s", 16, 64)
    extract(tiny_llama, records, store, log=logs.append, part_records=4)
    first = {r["id"]: store.window(r).clone() for r in records}
    logs.clear()
    again = FeatureStore(tmp_path / "s", 16, 64)  # a new run reads what the last one stored
    extract(tiny_llama, records + records[:2], again, log=logs.append, part_records=4)
    assert logs == [] and len(again) == 6
    more = _records(3, seed=1)
    extract(tiny_llama, records + more, again, log=logs.append, part_records=4)
    assert "computing 3" in logs[0] and again.parts == {0, 1, 2} and len(again) == 9
    assert all(torch.equal(again.window(r), first[r["id"]]) for r in records)
    assert again.missing(records + more) == []


def test_an_interrupted_part_is_computed_again(tiny_llama, tmp_path):
    """A part is written to a temporary file and renamed: a kill mid-write leaves no part, and the next run
    computes those records again."""
    records = _records(4)
    store = FeatureStore(tmp_path / "s", 16, 64)
    store.folder.mkdir(parents=True)
    (store.folder / "part-00000.tmp").write_bytes(b"half a part")
    assert FeatureStore(tmp_path / "s", 16, 64).missing(records) == records
    extract(tiny_llama, records, store, log=lambda m: None)
    assert {record_key(r["ids"]) for r in records} == set(store.index)
