"""The reader of a ground truth's engine.json that every engine's settings share: the account of
each key (`Setting`, `ResolvedSettings`), the one-line refusal (`EngineSettingsError`), and the
readers of what every capture may carry: its block size and pool, a setting the step cost was
measured at, the served model's geometry and the GPU (validation/engine_settings.py for
transformers captures, validation/vllm_settings.py for vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cachepilot_sim.config import RunConfig
from cachepilot_sim.cost.profile_scaling import DEVICE_PRESETS  # noqa: F401 (re-exported)
from cachepilot_sim.inputs import InputError

ENGINE_FILE = "engine.json"
MAX_SETTING = 2**31 - 1  # the largest count (blocks, tokens, requests) a setting may hold
# The conf/gpu preset of each GPU a capture names (engine.json `gpu`), and its memory in GB: the
# replay runs on the capture's GPU (a fitted step cost is checked against it, config/run.py).
PRESET_VRAM_GB = {"h200": 141, "h100_sxm": 80}

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


class Reader:
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
            raise self.fail(
                key, f"is null; expected {kind_name(kind)} (omit a setting not recorded)"
            )
        if isinstance(value, bool) and kind is not bool:
            raise self.fail(key, f"expected {kind_name(kind)}")
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {kind_name(kind)}")
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


def kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join({"int": "an integer", "float": "a number", "bool": "true or false"}.get(
        k.__name__, k.__name__) for k in kinds)  # fmt: skip


def read_pool(r: Reader) -> int | None:
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


def check_fitted(r: Reader, key: str, value: Any, representable: bool) -> bool:
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


def read_gpu(r: Reader) -> None:
    """The capture's GPU: its conf/gpu preset (and memory), and a transfer when the step cost
    was measured on another one."""
    r.out.gpu = read_gpu_name(r)
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


def read_gpu_name(r: Reader) -> str | None:
    """The capture's GPU name (absent: None); null or not a string is refused: the replay would
    run on the H200 without a word."""
    if "gpu" not in r.engine:
        return None
    gpu = r.engine["gpu"]
    if not isinstance(gpu, str) or not gpu:
        raise r.fail("gpu", "expected the GPU's name (a non-empty string)")
    return gpu


def read_model(r: Reader) -> None:
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
