"""The "predict on hardware" choice the compare and theory tabs share: this machine, or a cost profile bundled
under `assets/hardware/` (`specdec.costs.profile.bundled_profiles`), whose v(n) and c price the acceptance
measured here."""
from __future__ import annotations

import gradio as gr

from specdec.costs.profile import CostProfile

THIS_MACHINE = "this machine"  # the choice that predicts with this machine's own costs (no profile)


def choices(profiles: dict[str, CostProfile]) -> list[tuple[str, str]]:
    """(label, value) of the dropdown: this machine, then each profile (its hardware, day and target) by file name."""
    return [(THIS_MACHINE, THIS_MACHINE), *((f"{p.title}; target {p.target}", name) for name, p in profiles.items())]


def hardware_dropdown(profiles: dict[str, CostProfile], elem_id: str) -> gr.Dropdown:
    return gr.Dropdown(choices(profiles), value=THIS_MACHINE, label="predict on hardware", elem_id=elem_id,
                       info="this machine, or a bundled cost profile: its v(n) and c price the α̂ measured here")


def chosen_profile(profiles: dict[str, CostProfile], value: str | None) -> CostProfile | None:
    """The profile the dropdown's `value` names; None for this machine."""
    if not value or value == THIS_MACHINE:
        return None
    if value not in profiles:
        raise ValueError(f"predict on hardware: pick {THIS_MACHINE} or one of the bundled profiles "
                         f"({', '.join(profiles) or 'none here'})")
    return profiles[value]
