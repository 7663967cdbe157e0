"""The built-in geometry problem generator: one problem per seed, with a rendered, labelled diagram.

`generate(seed)` draws a topic (triangles, circles, parallel lines, polygons, areas), then one of its
templates, then the template's numbers, all from `random.Random(seed)`: the same seed gives the same
problem and the same pixels. Answers are exact sympy numbers written in LaTeX (`2 \\sqrt{13}`,
`\\frac{49 \\pi}{2}`). Half the problems are multiple choice like Geometry3K: the answer and three
of the template's wrong answers (or scaled answers when those run short), in random order.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import sympy
from PIL import Image

from vistarl.clients.images import encode_image
from vistarl.services.geo3k.generator import areas, circles, parallel, polygons, triangles
from vistarl.services.geo3k.generator.draft import Draft, Template
from vistarl.services.geo3k.sample import IMAGE_PLACEHOLDER

TOPICS: dict[str, tuple[Template, ...]] = {
    "triangles": triangles.TEMPLATES,
    "circles": circles.TEMPLATES,
    "parallel_lines": parallel.TEMPLATES,
    "polygons": polygons.TEMPLATES,
    "areas": areas.TEMPLATES,
}
MULTIPLE_CHOICE_SHARE = 0.5
CHOICES = 4
FALLBACK_FACTORS = (sympy.Rational(1, 2), sympy.Integer(2), sympy.Rational(3, 2), sympy.Rational(3, 4))


@dataclass(frozen=True)
class GeneratedProblem:
    """A generated problem in the Geometry3K shape, with its diagram as a PIL image."""

    seed: int
    topic: str
    key: str
    """The mathematical content (template and numbers), without names, layout or choice order."""
    problem: str
    answer: str
    choices: list[str] | None
    image: Image.Image

    @property
    def id(self) -> str:
        """The problem's id in samples: `generated-<seed>`."""
        return f"generated-{self.seed}"

    def sample(self) -> dict[str, Any]:
        """The problem as a JSON-safe row of the sample schema (the image as a PNG data URL)."""
        return {
            "problem": self.problem,
            "answer": self.answer,
            "images": [encode_image(self.image)],
            "choices": self.choices,
            "id": self.id,
        }


def generate(seed: int) -> GeneratedProblem:
    """The problem of `seed`."""
    rng = random.Random(seed)
    topic = rng.choice(sorted(TOPICS))
    draft = rng.choice(TOPICS[topic])(rng)
    choices = _choices(draft, rng) if rng.random() < MULTIPLE_CHOICE_SHARE else None
    return GeneratedProblem(
        seed=seed,
        topic=topic,
        key=draft.key,
        problem=IMAGE_PLACEHOLDER + draft.statement,
        answer=sympy.latex(draft.answer),
        choices=choices,
        image=draft.diagram.render(draft.rotation_deg),
    )


def _choices(draft: Draft, rng: random.Random) -> list[str]:
    """The answer among three wrong values, all positive and numerically distinct, shuffled."""
    values = [draft.answer]
    candidates = [*draft.distractors, *(draft.answer * factor for factor in FALLBACK_FACTORS)]
    for candidate in candidates:
        if len(values) == CHOICES:
            break
        number = float(candidate)
        if number > 0 and all(abs(number - float(value)) > 1e-6 for value in values):
            values.append(sympy.nsimplify(candidate) if candidate.is_Float else candidate)
    rng.shuffle(values)
    return [sympy.latex(value) for value in values]
