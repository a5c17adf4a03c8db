"""experiments/policy_frontier.py: the paired ratios, their intervals and the gap closed, on cells
made up here (the simulations themselves are the experiment, not a test)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from scipy import stats

PATH = Path(__file__).resolve().parents[2] / "experiments" / "policy_frontier.py"


@pytest.fixture(scope="module")
def frontier() -> ModuleType:
    spec = importlib.util.spec_from_file_location("policy_frontier", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["policy_frontier"] = module  # its dataclass looks its module up while defined
    spec.loader.exec_module(module)
    return module


def cell(key: str, restore_s: float, **extra: Any) -> dict[str, Any]:
    return {"cell": key, "realized_restore_s": restore_s, "ttft_p99_s": 1.0,
            "goodput_req_s": 1.0, "completed": 10, "rejected": 0, **extra}  # fmt: skip


def test_the_ratio_over_seeds_is_paired_with_a_t_interval(frontier: ModuleType) -> None:
    base = "mixed_spike|16|on"
    lru, pol = [4.0, 5.0, 6.0, 3.0], [3.0, 4.5, 5.0, 3.3]
    cells = {}
    for s, (a, b) in enumerate(zip(lru, pol, strict=True)):
        cells[f"{base}|lru|{s}"] = cell(f"{base}|lru|{s}", a)
        cells[f"{base}|sieve|{s}"] = cell(f"{base}|sieve|{s}", b)
    mean, low, high, n = frontier.paired_ratio(cells, base, "sieve", [0, 1, 2, 3, 9])
    r = np.array(pol) / np.array(lru)
    want = stats.t.interval(0.95, 3, loc=r.mean(), scale=stats.sem(r))
    assert n == 4  # seed 9 has no cell
    assert mean == pytest.approx(r.mean())
    assert (low, high) == pytest.approx(want)


def test_one_seed_gets_a_paired_bootstrap_over_requests(frontier: ModuleType) -> None:
    base = "mooncake|141|off"
    rng = np.random.default_rng(1)
    lru = rng.exponential(100.0, 500)
    half = lru * 0.5
    cells = {
        f"{base}|lru|0": cell("l", float(lru.sum()), request_restore_ms=lru.tolist()),
        f"{base}|lfu|0": cell("f", float(half.sum()), request_restore_ms=half.tolist()),
        f"{base}|fifo|0": cell("g", float(lru[::-1].sum()), request_restore_ms=lru[::-1].tolist()),
    }
    mean, low, high, n = frontier.paired_ratio(cells, base, "lfu", [0])
    assert n == 1 and mean == pytest.approx(0.5) and low == pytest.approx(0.5)
    assert high == pytest.approx(0.5)  # every request halved: no spread
    mean, low, high, _ = frontier.paired_ratio(cells, base, "fifo", [0])
    assert mean == pytest.approx(1.0)
    assert low < 1.0 < high  # same total, requests reshuffled: the pairing sees the noise


def test_gap_closed_is_the_share_of_lrus_excess_over_the_reference(
    frontier: ModuleType,
) -> None:
    means = {"lru": 10.0, "lfu": 8.0, "sieve": 9.0, "perc": 7.0, "perc_clairvoyant": 6.0,
             "LP bound": 2.0}  # fmt: skip
    lines = frontier.gap_closed(means)
    assert "best classical: **lfu**" in lines[0]
    assert "closes 50% of the gap to perc_clairvoyant" in lines[0]
    assert "closes 25% of the gap to LP bound" in lines[0]
    assert "best online: **perc**" in lines[1]
    assert "closes 75% of the gap to perc_clairvoyant" in lines[1]


def test_an_unknown_policy_is_a_one_line_error(
    frontier: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["policy_frontier.py", "--policies", "lru", "belady9"])
    with pytest.raises(SystemExit) as stop:
        frontier.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "belady9" in err and "known" in err and len(err.strip().splitlines()) == 1


def test_no_ratio_where_lru_paid_no_restore(frontier: ModuleType) -> None:
    base = "azure_conv|24|on"
    cells = {
        f"{base}|lru|0": cell(f"{base}|lru|0", 0.0),
        f"{base}|perc|0": cell(f"{base}|perc|0", 0.5),
    }
    assert frontier.paired_ratio(cells, base, "perc", [0]) is None
    base = "mixed_spike|16|on"
    cells = {f"{base}|{p}|{s}": cell(f"{base}|{p}|{s}", v)
             for p, vals in (("lru", [0.0, 2.0, 4.0]), ("perc", [1.0, 1.0, 3.0]))
             for s, v in enumerate(vals)}  # fmt: skip
    mean, _, _, n = frontier.paired_ratio(cells, base, "perc", [0, 1, 2])
    assert n == 2 and np.isclose(mean, (0.5 + 0.75) / 2)
