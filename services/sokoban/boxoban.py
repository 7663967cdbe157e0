"""The vendored DeepMind Boxoban level files: names, parsing, and cached loading.

Each file holds levels written as a `; N` line followed by 10 XSB rows; see `data/boxoban/README.md`.
"""

from __future__ import annotations

import functools
from importlib import resources

from vistarl.services.sokoban.game import Level, LevelError

BOXOBAN_FILES = ("unfiltered_test_000", "medium_valid_000", "hard_000")


def boxoban_file_name(name: str) -> str:
    """Normalise a file name given with or without `.txt`; raise `ValueError` for an unknown file."""
    stem = name.removesuffix(".txt")
    if stem not in BOXOBAN_FILES:
        raise ValueError(f"unknown Boxoban file {name!r}; choose one of {', '.join(BOXOBAN_FILES)}")
    return stem


@functools.cache
def boxoban_levels(name: str) -> tuple[Level, ...]:
    """Every level of a vendored Boxoban file, in file order (parsed once per process)."""
    path = resources.files("vistarl.services.sokoban") / "data" / "boxoban" / f"{boxoban_file_name(name)}.txt"
    return parse_boxoban(path.read_text(encoding="utf-8"))


def parse_boxoban(text: str) -> tuple[Level, ...]:
    """Parse Boxoban text: a `; N` header line before each level's XSB rows; blank lines are ignored."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith(";"):
            blocks.append([])
        elif line.strip():
            if not blocks:
                raise LevelError("Boxoban text must start with a '; N' header line")
            blocks[-1].append(line)
    return tuple(Level.from_xsb("\n".join(rows)) for rows in blocks)
