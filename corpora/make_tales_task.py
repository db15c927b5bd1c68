"""Write `tiny_tales_task.jsonl`: a multiple-choice task for `tk eval -m MODEL --task`, made from held-out tales.

The stories are those of `tiny_tales_test.txt` (corpora/make_tiny_tales.py, 100 stories of seed
4321, none of them in `tiny_tales.txt`), so no item is text the default corpus trains on. Each
item is one story cut just before a word that the story itself has already fixed, the question;
its choices are that word and three others from the generator's own vocabularies, in a seeded
order:

- hero: `... "What a lovely kite!" said` -> the hero's name (named three times before);
- found: `... She took the` -> what the hero found (`found a blue kite under a rock.`);
- day: `... They played with the kite on` -> the day after the one the kite was found on
  (`On Monday, ...`), in the half of the stories that have that sentence.

The context is the story so far, the question the start of the corpus's own sentence, so a model
trained on `tiny_tales.txt` has seen such sentences but never these stories: it answers by
reading the story, not by remembering it. A model that has not learned to read its context
(the unigram, an early run) picks one of four at chance, 25%. Each choice begins with its space,
as lm-evaluation-harness writes choices (the context ends without one).

One JSON object per line: {"context": ..., "choices": [...], "gold": i, "kind": "hero"}; `kind`
is for the reader, `tk eval` ignores it.

Licence: like the tales, generated for this project and dedicated to the public domain under
CC0 1.0 (https://creativecommons.org/publicdomain/zero/1.0/).

    python corpora/make_tales_task.py            # rewrites corpora/tiny_tales_task.jsonl
    python corpora/make_tales_task.py -o -       # prints it
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
STORY_SEED, STORIES = 4321, 100  # tiny_tales_test.txt's
CHOICE_SEED = 2718  # the distractors and the order of the choices


def _tales():
    """corpora/make_tiny_tales.py as a module (corpora/ is not a package)."""
    spec = importlib.util.spec_from_file_location("make_tiny_tales", HERE / "make_tiny_tales.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _item(story: str, question: str, answer: str, others: list[str], kind: str, rng: random.Random) -> dict:
    """The story up to and including `question` as the context; `answer` and three of `others` as choices."""
    cut = story.index(question) + len(question)
    choices = [answer, *rng.sample([o for o in others if o != answer], 3)]
    rng.shuffle(choices)
    return {"context": story[:cut], "choices": [" " + c for c in choices], "gold": choices.index(answer), "kind": kind}


def items() -> list[dict]:
    tales = _tales()
    story_rng, rng = random.Random(STORY_SEED), random.Random(CHOICE_SEED)
    names = sorted({n for ns in tales.NAMES.values() for n in ns})
    things = [thing for _, thing in tales.FINDS]
    out = []
    for _ in range(STORIES):
        # the draws write_corpus makes, so the stories are tiny_tales_test.txt's
        story, facts = tales.tale_and_facts(story_rng)
        hero, thing, found_day, pron = facts["hero"], facts["thing"], facts["day"], facts["pron"].capitalize()
        out.append(_item(story, f'"What a lovely {thing}!" said', hero, names, "hero", rng))
        out.append(_item(story, f"{pron} took the", thing, things, "found", rng))
        played = f"They played with the {thing} on"
        if played in story:
            next_day = tales.DAYS[(tales.DAYS.index(found_day) + 1) % 7]
            out.append(_item(story, played, next_day, tales.DAYS, "day", rng))
    return out


def lines() -> list[str]:
    return [json.dumps(item, ensure_ascii=False) for item in items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default=str(HERE / "tiny_tales_task.jsonl"), help="- for stdout")
    args = parser.parse_args()
    data = "".join(line + "\n" for line in lines())
    if args.output == "-":
        sys.stdout.write(data)
    else:
        _tales().write_atomic(Path(args.output), data)  # the corpora's one writer


if __name__ == "__main__":
    main()
