"""Scenes by name: the vendored VSI-Bench rooms and the synthetic training rooms (`synth-N`)."""

from __future__ import annotations

from vistarl.services.vsi.scenes import Scene, SceneError, load_vsibench
from vistarl.services.vsi.synth import synth_scene, synth_seed


def get_scene(name: str) -> Scene:
    """The scene called `name`; a `SceneError` says which names exist."""
    real = load_vsibench().get(name)
    if real is not None:
        return real
    seed = synth_seed(name)
    if seed is None:
        raise SceneError(
            f"unknown scene {name!r}: expected a VSI-Bench scene name (e.g. 'scene0011_00', '41069025') "
            "or a synthetic room 'synth-N'"
        )
    return synth_scene(seed)


def is_vsibench(name: str) -> bool:
    """Whether `name` is one of the 288 VSI-Bench scenes."""
    return name in load_vsibench()
