"""`vistarl vsi render`: a scene's scripted tour, its start view and a top-down map, as PNG files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

vsi_app = typer.Typer(help="VSI tools: look at the rendered rooms.", no_args_is_help=True)


@vsi_app.command("render")
def render_command(
    scene: Annotated[str, typer.Option("--scene", help="A VSI-Bench scene name, or synth-N.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for the PNG files.")],
    size: Annotated[int, typer.Option("--size", min=64, max=1024, help="Frame side in pixels.")] = 384,
    map_size: Annotated[int, typer.Option("--map-size", min=128, max=2048, help="Map side in pixels.")] = 640,
) -> None:
    """Write tour_01.png … (the frames an episode shows at reset), start.png (the first view) and map.png."""
    from vistarl.services.vsi.camera import start_pose, tour_poses
    from vistarl.services.vsi.catalog import get_scene
    from vistarl.services.vsi.render import render_frames
    from vistarl.services.vsi.scenes import SceneError
    from vistarl.services.vsi.topdown import top_down_map

    try:
        room = get_scene(scene)
    except SceneError as exc:
        raise typer.BadParameter(str(exc), param_hint="--scene") from None
    out.mkdir(parents=True, exist_ok=True)
    tour, start = tour_poses(room), start_pose(room)
    frames = render_frames(room, [*tour, start], size)
    names = [f"tour_{k:02d}.png" for k in range(1, len(tour) + 1)] + ["start.png"]
    for name, frame in zip(names, frames, strict=True):
        frame.image.save(out / name)
    top_down_map(room, map_size, tour, start).save(out / "map.png")
    Console().print(
        f"{room.name} ({room.dataset}, {len(room.objects)} objects, {room.room_size:.1f} m²): "
        f"wrote {len(names) + 1} images to {out}"
    )


def register(app: typer.Typer) -> None:
    """Attach `vistarl vsi ...`."""
    app.add_typer(vsi_app, name="vsi")
