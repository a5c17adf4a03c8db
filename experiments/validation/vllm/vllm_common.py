"""What the vLLM smoke run and the vLLM capture share: the process environment, the dummy-weight
Llama-3-8B model folder, and the one engine configuration (every scheduler limit pinned).

Imports neither torch nor vllm at module level, so the CPU tests can read the settings."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/validation
from capture_common import LLAMA3_8B  # noqa: E402  (the transformers captures' model)

# Offline, no usage report, and the PyTorch top-k/top-p sampler (the FlashInfer one imports
# flashinfer, which is not carried).
ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
}


def apply_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Set ENV (and `extra`) in this process before vllm is imported; return what was set."""
    env = {**ENV, **(extra or {})}
    os.environ.update(env)
    return env


def write_model_dir(path: Path, overrides: dict[str, Any] | None = None) -> Path:
    """A model folder holding only config.json (LlamaForCausalLM); weights come from
    load_format='dummy', the tokenizer is skipped."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(**{**LLAMA3_8B, **(overrides or {})})
    cfg.architectures = ["LlamaForCausalLM"]
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(path))
    return path


@dataclass
class EngineSpec:
    """One vLLM engine configuration, every scheduler limit given explicitly (the entry points'
    defaults differ on large GPUs: LLM 16384 batched tokens, the API server 8192;
    the defaults here are the API server's, what `vllm serve` users run)."""

    name: str = "vllm_main"
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    async_scheduling: bool = True
    max_model_len: int = 16384
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: int | None = None
    compilation_mode: int = 0  # 0: no torch.compile; 3: vLLM's default (VLLM_COMPILE)
    cudagraph_mode: str = "FULL_DECODE_ONLY"
    enforce_eager: bool = False
    dtype: str = "bfloat16"
    seed: int = 0
    kv_offloading_size_gib: float | None = None  # CPU offload through the offloading connector
    env: dict[str, str] = field(default_factory=dict)  # e.g. VLLM_USE_V2_MODEL_RUNNER=0

    def engine_kwargs(self, model_dir: Path) -> dict[str, Any]:
        """Keyword arguments of vllm.engine.arg_utils.(Async)EngineArgs."""
        kw: dict[str, Any] = dict(
            model=str(model_dir),
            load_format="dummy",
            skip_tokenizer_init=True,
            generation_config="vllm",
            dtype=self.dtype,
            seed=self.seed,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching,
            enable_chunked_prefill=self.enable_chunked_prefill,
            async_scheduling=self.async_scheduling,
            gpu_memory_utilization=self.gpu_memory_utilization,
            num_gpu_blocks_override=self.num_gpu_blocks_override,
            enforce_eager=self.enforce_eager,
            disable_log_stats=False,
        )
        if not self.enforce_eager:
            kw["compilation_config"] = {
                "mode": self.compilation_mode,
                "cudagraph_mode": self.cudagraph_mode,
            }
        if self.kv_offloading_size_gib is not None:
            kw["kv_offloading_size"] = self.kv_offloading_size_gib
            kw["kv_offloading_backend"] = "native"
        return kw

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
