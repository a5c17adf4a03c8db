"""The engine settings of a ground truth (its `engine.json`), honoured or refused for a replay.

Every key a capture of transformers continuous batching writes is one of three kinds:

- a setting the simulator honours: it becomes a config override (the token budget, the request
  cap, blocks and block size, the safety margin, async batching, the query and KV padding, the
  graph mode, the CPU swap space);
- a setting the engine profile's step cost was measured at (`engine.fitted_settings`): a capture
  made with another value is refused, unless the profile's step cost represents that setting
  (the physical step cost takes any padding);
- a record of the run (versions, times, the workload, what happened): read by nothing.

A key the reader does not know is refused: it may be a setting, and a setting the model cannot
represent is never silently ignored. Every refusal is one line naming the file and the key.
Captures of other engines (converted vLLM or SGLang benchmark files, hand-made folders) carry
the benchmark's own keys: their block size and pool are honoured and the rest is listed as not
read, so `validate` prints what it replayed and what it did not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachepilot_sim.config import RunConfig, StepCost
from cachepilot_sim.inputs import InputError
from cachepilot_sim.validation.engine_behaviour import graph_and_swap_overrides

HF_ENGINE = "transformers-continuous-batching"
# The conf/gpu preset of each GPU a capture names (engine.json `gpu`), and its memory in GB: the
# replay runs on the capture's GPU (a fitted step cost is checked against it, config/run.py).
DEVICE_PRESETS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100_sxm"}
PRESET_VRAM_GB = {"h200": 141, "h100_sxm": 80}
ENGINE_FILE = "engine.json"
MAX_SETTING = 2**31 - 1  # the largest count (blocks, tokens, requests) a setting may hold

# Records of the run, not settings: read by nothing (transformers captures).
HF_RECORDS = frozenset(
    {
        "engine",
        "engine_spec",
        "num_pages",  # num_blocks x block_size
        "max_memory_percent",  # how the engine sized num_blocks, which is read
        "versions",
        "engine_init_s",
        "precaptured_graphs",
        "precapture_skipped",
        "precapture_s",
        "precapture_keys_per_pair",
        "driver",
        "workload",
        "run",
        "captured_at",
        "workload_meta",
        "wall_s",
        "graph_captures_during_run",
        "preemption_events",
        "prefix_cache_cleared_before_run",
        "command",
        "scheduler",  # the class name of scheduler_type, which is read
        "cpu_offload_space_gib",  # num_cpu_blocks, which is read, in GiB
        "gpu",  # compared with engine.fitted_on: a transfer is reported, not refused
    }
)


# A step-cost setting next to a profile whose cost is the idealised roofline (no padding, no
# graphs): listed, and the answer is labelled unvalidated.
ROOFLINE_NOTE = "not modelled (roofline step cost: idealised, unvalidated)"


class EngineSettingsError(InputError):
    """A setting of `engine.json` the engine profile cannot replay (one line: file and key)."""


@dataclass
class Setting:
    """One key of engine.json and what the replay did with it."""

    key: str
    value: Any
    use: str  # the override applied, "requires ..." for a checked setting, or "not read"


@dataclass
class ResolvedSettings:
    """The overrides a replay applies and the account of every key."""

    overrides: list[str] = field(default_factory=list)
    settings: list[Setting] = field(default_factory=list)
    gpu: str | None = None  # the capture's GPU
    fitted_on: str = ""  # the GPU the profile's step cost was measured on
    notes: list[str] = field(default_factory=list)

    @property
    def transfer(self) -> bool:
        """The capture's GPU is not the one the step cost was measured on."""
        return bool(self.fitted_on and self.gpu and self.gpu != self.fitted_on)

    def as_dict(self) -> dict[str, Any]:
        return {
            "overrides": self.overrides,
            "gpu": self.gpu,
            "fitted_on": self.fitted_on or None,
            "transfer": self.transfer,
            "notes": self.notes,
            "settings": {s.key: {"value": s.value, "use": s.use} for s in self.settings},
        }


def normalised(value: Any) -> str:
    """A setting's value as `fitted_settings` spells it: true/false, numbers, lists joined."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(normalised(v) for v in value)
    return str(value)


class _Reader:
    def __init__(self, path: Path, engine: dict[str, Any], cfg: RunConfig) -> None:
        self.file = path / ENGINE_FILE
        self.engine = engine
        self.cfg = cfg
        self.out = ResolvedSettings(fitted_on=cfg.engine.fitted_on)

    def fail(self, key: str, why: str) -> EngineSettingsError:
        shown = normalised(self.engine.get(key))
        if not shown.isprintable() or not shown or len(shown) > 60:  # one line, readable
            shown = repr(self.engine.get(key))[:60]
        return EngineSettingsError(
            f"{self.file}: key {key!r} = {shown}: {why} (engine={self.cfg.engine.name})"
        )

    def get(self, key: str, kind: type | tuple[type, ...]) -> Any:
        """The setting `key` (None when absent), of type `kind`; null, another type, or a number
        beyond MAX_SETTING is refused: a setting given is replayed or refused, never dropped."""
        if key not in self.engine:
            return None
        value = self.engine[key]
        if value is None:
            raise self.fail(key, f"is null; expected {_name(kind)} (omit a setting not recorded)")
        if isinstance(value, bool) and kind is not bool:
            raise self.fail(key, f"expected {_name(kind)}")
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {_name(kind)}")
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not -MAX_SETTING <= value <= MAX_SETTING:  # also refuses NaN
                raise self.fail(key, f"out of range (|value| <= {MAX_SETTING})")
        return value

    def honour(self, key: str, value: Any, *overrides: str) -> None:
        self.out.overrides += overrides
        self.out.settings.append(Setting(key, value, " ".join(overrides)))

    def positive(self, key: str) -> int | None:
        value = self.get(key, int)
        if value is not None and value <= 0:
            raise self.fail(key, "must be a positive integer")
        return value


def _name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({"int": "an integer", "float": "a number", "bool": "true or false"}.get(
        k.__name__, k.__name__) for k in kinds)  # fmt: skip


def _pool(r: _Reader) -> int | None:
    """Block size and pool: the profile's blocks become the engine's."""
    size = r.positive("block_size")
    blocks = r.get("num_blocks", int)
    if blocks is not None and blocks <= 0:
        raise r.fail("num_blocks", "must be a positive integer")
    if size is not None:
        r.honour("block_size", size, f"kv.block_tokens={size}", f"replay.hash_block_tokens={size}")
    if blocks is not None:
        if size is None:
            raise r.fail("num_blocks", "needs block_size beside it")
        r.honour("num_blocks", blocks, f"engine.kv_pool_blocks={blocks}")
    return size


def _fitted(r: _Reader, key: str, value: Any, representable: bool) -> bool:
    """A setting the step cost was measured at: equal, representable, or refused. True when the
    profile pins this key."""
    want = r.cfg.engine.fitted_settings.get(key)
    if want is None:
        return False
    if normalised(value) == want:
        r.out.settings.append(Setting(key, value, f"equals the step cost's {want}"))
        return True
    if representable:
        return False
    raise r.fail(
        key,
        f"the step cost of this profile was measured at {want} and cannot represent another "
        "value (a profile with step_cost physical can, or capture micro-runs at this setting)",
    )


def _hf(r: _Reader) -> None:
    e, cfg = r.engine, r.cfg
    physical = str(cfg.engine.step_cost) == "physical"  # takes any padding
    fitted = cfg.engine.step_cost != StepCost.ROOFLINE
    _pool(r)
    if (v := r.positive("max_batch_tokens")) is not None:
        r.honour("max_batch_tokens", v, f"batcher.throughput_token_budget={v}")
    if (v := r.positive("max_requests_per_batch")) is not None:
        r.honour("max_requests_per_batch", v, f"batcher.throughput_max_seqs={v}")
    margin = r.get("safety_margin", (int, float))
    if margin is not None:
        if not 0 <= margin < 1:
            raise r.fail("safety_margin", "must be in [0, 1)")
        r.honour("safety_margin", margin, f"engine.prefill_margin_fraction={margin}")
    if (v := r.get("use_async_batching", bool)) is not None:
        r.honour("use_async_batching", v, f"engine.async_scheduling={normalised(v)}")
    for key, field_name in (
        ("q_padding_interval_size", "q_pad_tokens"),
        ("kv_padding_interval_size", "kv_pad_tokens"),
    ):
        v = r.get(key, int)
        if v is None:
            continue
        if v < 0:
            raise r.fail(key, "must be >= 0")
        if not fitted:
            r.out.settings.append(Setting(key, v, ROOFLINE_NOTE))
            continue
        if _fitted(r, key, v, representable=physical):
            continue
        if key.startswith("q_") and v == 0:
            raise r.fail(key, "unpadded queries (graphs off) are not modelled")
        r.honour(key, v, f"engine.{field_name}={v}")
    _swap(r)
    _graphs(r, fitted)
    for key, want, why in (
        ("scheduler_type", "fifo", "only the FIFO scheduler's rules are modelled"),
        ("use_prefix_sharing", "true", "the replay always shares prefix blocks"),
        ("allow_block_sharing", "true", "the replay always shares prefix blocks"),
        ("decode_fast_path", "false", "the decode fast path is not modelled"),
        ("max_blocks_per_request", "0", "the decode fast path is not modelled"),
        ("compile", "false", "a torch.compile'd engine is not modelled"),
    ):
        if key in e:
            if normalised(e[key]) != want:
                raise r.fail(key, why)
            r.out.settings.append(Setting(key, e[key], f"requires {want}"))
    attn = e.get("attn_implementation")
    if attn is not None and not _fitted(r, "attn_implementation", attn, representable=False):
        use = ROOFLINE_NOTE if not fitted else "not pinned by this profile"
        r.out.settings.append(Setting("attn_implementation", attn, use))
    _model(r)
    r.out.gpu = _gpu(r)
    preset = DEVICE_PRESETS.get(r.out.gpu or "")
    if preset is not None:
        r.honour("gpu", r.out.gpu, f"gpu={preset}", f"vram_gb={PRESET_VRAM_GB[preset]}")
    elif r.out.gpu:
        r.out.notes.append(f"gpu {r.out.gpu!r} has no conf/gpu preset: replayed on the H200's")
    if r.out.transfer:
        r.out.notes.append(
            f"transfer: the step cost was measured on {r.out.fitted_on}, this capture ran on "
            f"{r.out.gpu}"
        )
    known = HF_RECORDS | {s.key for s in r.out.settings} | {"model", "kv_bytes_per_token"}
    known |= {"use_cuda_graph", "num_cpu_blocks"}
    for key in e:
        if key not in known:
            raise r.fail(key, "not a setting this reader knows; it cannot be replayed or ignored")


def _graphs(r: _Reader, fitted: bool) -> None:
    """use_cuda_graph (one flag per path, or one) and whether the graphs were captured before
    serving (precaptured_graphs) or lazily during it."""
    e = r.engine
    if "use_cuda_graph" not in e:
        return
    flags = e["use_cuda_graph"]
    flags = flags if isinstance(flags, list) else [flags]
    if not flags or not all(isinstance(f, bool) for f in flags):
        raise r.fail("use_cuda_graph", "expected true/false or a list of them")
    if not fitted:
        r.out.settings.append(Setting("use_cuda_graph", e["use_cuda_graph"], ROOFLINE_NOTE))
        return
    if not any(flags):
        if fitted:
            raise r.fail(
                "use_cuda_graph", "an eager engine is host-bound: this step cost was measured "
                "with CUDA graphs"
            )  # fmt: skip
        r.honour("use_cuda_graph", e["use_cuda_graph"], "engine.graph_mode=NONE")
        return
    graph = [o for o in _behaviour(r) if not o.startswith("engine.cpu_swap_blocks")]
    if "engine.graph_mode=LAZY" in graph and not r.cfg.engine.graph_capture_us:
        raise r.fail(
            "use_cuda_graph", "graphs captured lazily stall the engine, and this profile has no "
            "capture cost (engine.graph_capture_us: fit one with fit_capture_cost on other runs)"
        )  # fmt: skip
    r.honour("use_cuda_graph", e["use_cuda_graph"], *graph)


def _behaviour(r: _Reader) -> list[str]:
    """validation/engine_behaviour.py's overrides, its errors as this file's one line."""
    try:
        return graph_and_swap_overrides(r.engine, r.cfg.kv.block_tokens)
    except ValueError as err:
        raise EngineSettingsError(f"{r.file}: {err}") from None


def _swap(r: _Reader) -> None:
    """CPU swap of preempted requests (num_cpu_blocks, or cpu_offload_space_gib): swapped out
    and back over the link, not recomputed (components/cpu_swap.py)."""
    blocks = r.get("num_cpu_blocks", int)
    if blocks is not None and blocks < 0:
        raise r.fail("num_cpu_blocks", "must be >= 0")
    swap = [o for o in _behaviour(r) if o.startswith("engine.cpu_swap_blocks")]
    if swap == ["engine.cpu_swap_blocks=0"]:
        r.out.settings.append(Setting("num_cpu_blocks", 0, "no swap (recompute)"))
    elif swap:
        r.honour("num_cpu_blocks", r.engine.get("num_cpu_blocks"), *swap)


def _model(r: _Reader) -> None:
    """The served model's geometry must be the profile's model."""
    e = r.engine
    m = r.cfg.models[0] if r.cfg.models else None
    if m is None:
        return
    geom = e.get("model")
    if geom is not None:
        if not isinstance(geom, dict):
            raise r.fail("model", "expected an object")
        for key, want in (
            ("num_hidden_layers", m.num_layers),
            ("num_key_value_heads", m.num_kv_heads),
            ("num_attention_heads", m.num_attention_heads),
        ):
            got = geom.get(key)
            if got is not None and got != want:
                raise EngineSettingsError(
                    f"{r.file}: key 'model.{key}' = {got}: the replayed model ({m.name}) has {want}"
                )
        pinned = r.cfg.engine.fitted_settings
        for key, got in geom.items():  # the shape the step cost was measured on
            want_s = pinned.get(f"model.{key}")
            if want_s is not None and normalised(got) != want_s:
                raise EngineSettingsError(
                    f"{r.file}: key 'model.{key}' = {normalised(got)}: the step cost of "
                    f"engine={r.cfg.engine.name} was measured with {want_s}"
                )
        r.out.settings.append(Setting("model", "...", f"matches model={m.name}"))
    per_token = r.get("kv_bytes_per_token", int)
    if per_token is not None:
        if per_token != m.kv_bytes_per_token:
            raise r.fail(
                "kv_bytes_per_token", f"the replayed model ({m.name}) holds "
                f"{m.kv_bytes_per_token} bytes per token"
            )  # fmt: skip
        r.out.settings.append(Setting("kv_bytes_per_token", per_token, "matches the model"))


def _gpu(r: _Reader) -> str | None:
    """The capture's GPU name (absent: None); null or not a string is refused: the replay would
    run on the H200 without a word."""
    if "gpu" not in r.engine:
        return None
    gpu = r.engine["gpu"]
    if not isinstance(gpu, str) or not gpu:
        raise r.fail("gpu", "expected the GPU's name (a non-empty string)")
    return gpu


def resolve(path: Path, engine: dict[str, Any], cfg: RunConfig) -> ResolvedSettings:
    """The overrides and the account of `engine` (the engine.json of the ground truth at `path`)
    for a replay on the profile `cfg`; EngineSettingsError for a setting it cannot replay."""
    r = _Reader(path, engine, cfg)
    if engine.get("engine") == HF_ENGINE:
        _hf(r)
        return r.out
    _pool(r)
    margin = r.get("safety_margin", (int, float))
    if margin is not None:
        if not 0 <= margin < 1:
            raise r.fail("safety_margin", "must be in [0, 1)")
        r.honour("safety_margin", margin, f"engine.prefill_margin_fraction={margin}")
    r.out.gpu = _gpu(r)
    read = {s.key for s in r.out.settings}
    for key, value in engine.items():
        if key not in read and key != "engine":
            r.out.settings.append(Setting(key, value, "not read (not a transformers capture)"))
    return r.out
