"""Beam search presets of the normalization paper, picked by architecture name."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    name: str
    beam: int
    lenpen: float


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("transformer_wmt", beam=4, lenpen=0.6),
        Preset("transformer_iwslt", beam=5, lenpen=1.0),
        Preset("dynamicconv_wmt", beam=5, lenpen=0.5),
        Preset("dynamicconv_iwslt", beam=4, lenpen=1.0),
    )
}
PRESET_CHOICES = ("auto", *PRESETS)


def preset_for_arch(arch: str) -> Preset:
    """``wmt``/``big`` in the name: WMT preset, else IWSLT; dynamicconv/lightconv: DynamicConv."""
    name = arch.lower()
    family = "dynamicconv" if ("dynamicconv" in name or "lightconv" in name) else "transformer"
    setting = "wmt" if ("wmt" in name or "big" in name) else "iwslt"
    return PRESETS[f"{family}_{setting}"]


def resolve_preset(preset: str, arch: str | None) -> Preset:
    if preset != "auto":
        if preset not in PRESETS:
            raise ValueError(f"--preset {preset!r} is unknown; choose one of {PRESET_CHOICES}")
        return PRESETS[preset]
    if not arch:
        raise ValueError("--preset auto needs the checkpoint's arch name; pass --preset explicitly")
    return preset_for_arch(arch)
