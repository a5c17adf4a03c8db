"""Pick the Azure LLM 2023 conv window replayed as `azure_conv_sample` and clip its lengths.

Source: /work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv (CC-BY-4.0, Patel et
al., Splitwise, ISCA 2024). The window is the first `--num` requests at or after `--start`; context
tokens are clipped to [16, 3072] and generated tokens to [4, 512] so one request fits the engine's
4096-token graph set. Times stay in trace seconds; capture.py stretches them to the engine's load.

    python3 experiments/validation/azure_window.py > experiments/validation/azure_conv_window.json
"""

import argparse
import csv
import json
from datetime import datetime
from pathlib import Path

TRACE = Path("/work/shared/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--start", default="2023-11-16 18:30:00")
    ap.add_argument("--num", type=int, default=150)
    args = ap.parse_args()
    start = datetime.fromisoformat(args.start)
    rows = []
    with open(args.trace, newline="") as f:
        for rec in csv.DictReader(f):
            t = datetime.fromisoformat(rec["TIMESTAMP"][:26])
            if t < start:
                continue
            ctx = min(max(int(rec["ContextTokens"]), 16), 3072)
            gen = min(max(int(rec["GeneratedTokens"]), 4), 512)
            rows.append([(t - start).total_seconds(), ctx, gen])
            if len(rows) == args.num:
                break
    meta = {
        "source": str(args.trace),
        "start": args.start,
        "num": len(rows),
        "clip": {"context": [16, 3072], "generated": [4, 512]},
        "span_s": rows[-1][0] - rows[0][0],
    }
    print(json.dumps({"meta": meta, "rows": rows}))


if __name__ == "__main__":
    main()
