"""Questions from seeds: a question type, a scene and one of its drafts, lettered with the answer's place.

`generate_question(seed, scene_set, ...)` is deterministic per seed. Without a `question_type` the
draw is balanced across VSI-Bench's 8 tasks (a relative-direction question picks one of its three
levels). Training questions come from synthetic rooms, test questions from the VSI-Bench rooms
(`docs/vsi.md`).
"""

from __future__ import annotations

import random
from typing import Literal

from vistarl.services.vsi.catalog import get_scene
from vistarl.services.vsi.question import DIRECTION_TYPES, QuestionType, VsiQuestion, letter, lettered
from vistarl.services.vsi.scenes import Scene, vsibench_names
from vistarl.services.vsi.synth import synth_name
from vistarl.services.vsi.tasks import Draft, drafts

SceneSet = Literal["train", "test"]
SYNTH_TRIES = 64
"""Synthetic rooms tried for a question type before giving up (a type almost every room admits)."""


class GenerationError(ValueError):
    """No question of the kind asked for exists (e.g. a scene without two unique objects)."""


def draw_question_type(rng: random.Random) -> QuestionType:
    """One of VSI-Bench's 8 tasks, uniformly; relative direction then picks one of its three levels."""
    task = rng.choice([qt for qt in QuestionType if qt not in DIRECTION_TYPES[1:]])
    return rng.choice(DIRECTION_TYPES) if task in DIRECTION_TYPES else task


def generate_question(
    seed: int,
    scene_set: SceneSet = "train",
    scene_name: str | None = None,
    question_type: QuestionType | None = None,
) -> VsiQuestion:
    """The question of `seed`: from `scene_name` if given, else from a scene of `scene_set`."""
    rng = random.Random(f"vsi-question/{seed}")
    if scene_name is not None:
        scene = get_scene(scene_name)
        question_type = question_type or _type_for(scene, rng)
        found = drafts(scene, question_type)
        if not found:
            raise GenerationError(f"scene {scene_name!r} admits no {question_type.value} question")
    else:
        question_type = question_type or draw_question_type(rng)
        scene, found = _scene_for(question_type, scene_set, rng)
    draft = rng.choice(found)
    return finish(draft, scene, seed, rng.randrange(max(len(draft.choices), 1)), rng)


def finish(draft: Draft, scene: Scene, question_id: int, correct_at: int, rng: random.Random) -> VsiQuestion:
    """The question row of a draft: for multiple choice, the correct choice at letter `correct_at` and the
    others in `rng`'s order."""
    if draft.answer is not None:
        text, options, truth = draft.text, None, draft.answer
    else:
        wrong = list(draft.choices[1:])
        rng.shuffle(wrong)
        ordered = [*wrong[:correct_at], draft.choices[0], *wrong[correct_at:]]
        text, options, truth = (
            draft.text.replace("{choices}", ", ".join(ordered)),
            lettered(ordered),
            letter(correct_at),
        )
    return VsiQuestion(
        id=question_id,
        dataset=scene.dataset,
        scene_name=scene.name,
        question_type=draft.question_type,
        question=text,
        ground_truth=truth,
        options=options,
    )


def _type_for(scene: Scene, rng: random.Random) -> QuestionType:
    """A question type the scene admits, balanced across tasks as far as it allows."""
    for _ in range(4 * len(QuestionType)):
        question_type = draw_question_type(rng)
        if drafts(scene, question_type):
            return question_type
    return QuestionType.ROOM_SIZE_ESTIMATION


def _scene_for(
    question_type: QuestionType, scene_set: SceneSet, rng: random.Random
) -> tuple[Scene, list[Draft]]:
    """A scene of `scene_set` that admits a `question_type` question, and its drafts."""
    if scene_set == "test":
        names = list(vsibench_names())
        rng.shuffle(names)
    else:
        names = [synth_name(rng.randrange(10**9)) for _ in range(SYNTH_TRIES)]
    for name in names:
        scene = get_scene(name)
        found = drafts(scene, question_type)
        if found:
            return scene, found
    raise GenerationError(
        f"no {scene_set} scene among {len(names)} tried admits a {question_type.value} question"
    )
