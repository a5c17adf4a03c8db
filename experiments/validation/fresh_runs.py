#!/usr/bin/env python3
"""Second device call of 2026-12-02: each workload first on a freshly built engine.

multiturn (run 2 of the fresh-engine capture: its run-to-run spread) and pressure_soft_reset
(run 3: captured before on the engine that had just served pressure_queue)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from capture import MAIN_SPEC, PRESSURE_BLOCKS, main_plan
from capture_client import Session
from capture_workloads import PRESSURE_LEN, rename, w_poisson
from hf_engine import EngineSpec, destroy_engine, make_engine
from hf_instrument import Recorder
from hf_model import build_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--azure", type=Path, default=Path(__file__).with_name("azure_conv_window.json")
    )
    ap.add_argument("--azure-num", type=int, default=80)
    ap.add_argument("--azure-rate", type=float, default=2.4)
    ap.add_argument("--capacity-rps", type=float, default=11.7)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    stage = Path("/tmp/cp_fresh") / "gt"
    stage.mkdir(parents=True, exist_ok=True)
    model = build_model(False)
    s = Session(out=args.out, stage=stage, model=model, smoke=False)
    plan = {name: (reqs, meta) for name, reqs, meta in main_plan(args)}
    rec = Recorder(use_cuda=True)
    mgr, info = make_engine(model, MAIN_SPEC, rec, False)
    reqs, meta = plan["multiturn"]
    s.capture(mgr, rec, MAIN_SPEC, info, "multiturn", reqs, limit_s=90, meta=meta, run_ids=(2,))
    destroy_engine(mgr)
    reqs = w_poisson("pressure", 48, 3.0, seed=61, lengths=PRESSURE_LEN)
    meta = {
        "kind": "pressure",
        "rate_rps": 3.0,
        "num_blocks": PRESSURE_BLOCKS,
        **PRESSURE_LEN,
        "safety_margin": 0.0,
    }
    rec = Recorder(use_cuda=True)
    spec = EngineSpec("pressure_soft_reset", num_blocks=PRESSURE_BLOCKS, safety_margin=0.0)
    mgr, info = make_engine(model, spec, rec, False)
    s.capture(
        mgr,
        rec,
        spec,
        info,
        "pressure_soft_reset",
        rename(reqs, "pressure_soft_reset"),
        limit_s=45,
        meta=meta,
        run_ids=(3,),
    )
    destroy_engine(mgr)
    print("[done] " + json.dumps(s.summaries), flush=True)


if __name__ == "__main__":
    main()
