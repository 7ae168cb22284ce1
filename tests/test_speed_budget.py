"""scripts/speed_budget.py: the arithmetic behind docs/benchmarks.md's "What the open speed bars ask of the drafters"."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "speed_budget.py"


def _load():
    spec = importlib.util.spec_from_file_location("speed_budget", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _prompt(wall: float, prefill: float, accepts: list[int]) -> dict:
    return {"wall_time": wall, "prefill_s": prefill, "new_tokens": sum(accepts), "accept_lengths": accepts}


def test_a_bar_becomes_a_decoding_speedup_a_tau_and_a_step_cost_by_amdahls_law():
    """AR: 100 s, 20 of them prefill, 800 one-token steps (0.1 s each).  The mode: 21 s of prefill (its own is what
    it keeps), 400 steps of two tokens at 0.15 s (1.5 AR steps).  A 1.6x bar leaves 62.5 - 21 = 41.5 s for
    decoding: 80 / 41.5 = 1.928x; at 0.15 s a step that is 276.7 steps, so τ 800 / 276.7 = 2.892; at τ 2.5 (320
    steps) a step may take 41.5 / 320 = 0.1297 s = 1.297 AR steps."""
    sb = _load()
    ar = sb.split([_prompt(50.0, 10.0, [1] * 400), _prompt(50.0, 10.0, [1] * 400)])
    mode = sb.split([_prompt(40.5, 10.5, [2] * 200), _prompt(40.5, 10.5, [2] * 200)])
    assert (ar.step_s, mode.step_s, mode.tau) == (pytest.approx(0.1), pytest.approx(0.15), 2.0)
    b = sb.budget(ar, mode, 1.6, 2.5)
    assert b["prefill_share"] == pytest.approx(0.2)
    assert b["decode_speedup"] == pytest.approx(80 / 60)
    assert b["step_cost"] == pytest.approx(1.5)
    assert b["decode_speedup_needed"] == pytest.approx(80 / 41.5)
    assert b["tau_needed_at_step_cost"] == pytest.approx(800 * 0.15 / 41.5)
    assert b["step_cost_allowed_at_bar_tau"] == pytest.approx(41.5 * 2.5 / 800 / 0.1)
    # a bar the prefill alone forbids: no decoding time left, so no τ is enough
    assert sb.budget(ar, mode, 5.0, None)["tau_needed_at_step_cost"] == float("inf")
    assert sb.budget(ar, mode, 5.0, 2.5)["step_cost_allowed_at_bar_tau"] == 0.0  # not a negative step cost


def test_the_script_reads_a_bench_json(tmp_path):
    run = {"methods": {"ar": {"per_prompt": [_prompt(10.0, 2.0, [1] * 80)]},
                       "rest": {"per_prompt": [_prompt(6.0, 2.0, [2] * 40)]}}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run))
    out = subprocess.run([sys.executable, str(SCRIPT), str(path), "--bar", "rest=2:2.5"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "prefill 2.0 s (20%)" in out.stdout
    assert "rest       now 1.67x τ 2.00" in out.stdout and "needs decoding 2.67x" in out.stdout
