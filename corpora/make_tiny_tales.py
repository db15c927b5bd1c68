"""Write `tiny_tales.txt`: the default corpus, simple English stories from a small seeded grammar.

The text is generated, not copied, so the project owns it. A few names and the dash are
non-ASCII, so byte-level BPE has multi-byte characters to merge. It is built to be learnable by a small
model in a couple of minutes on a laptop, while still being text: names stay consistent within a
story, pronouns agree with the character, counting and the days of the week run in order, and
each story closes the way it opened. A tokenizer learns words and suffixes from it; a small model
visibly learns the story shape, the agreement, and the sequences.

    python corpora/make_tiny_tales.py              # rewrites corpora/tiny_tales.txt
    python corpora/make_tiny_tales.py --stories 100 --seed 4321 -o corpora/tiny_tales_test.txt
    python corpora/make_tiny_tales.py --stories 50 -o /tmp/sample.txt

tiny_tales_test.txt is held-out text for `tk eval`: 100 stories of another seed, none of them
in tiny_tales.txt.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
from pathlib import Path

CHARACTERS = [  # (kind, pronoun, possessive)
    ("rabbit", "she", "her"),
    ("fox", "he", "his"),
    ("bear", "he", "his"),
    ("mouse", "she", "her"),
    ("owl", "she", "her"),
    ("frog", "he", "his"),
    ("cat", "she", "her"),
    ("dog", "he", "his"),
    ("duck", "she", "her"),
    ("hedgehog", "he", "his"),
    ("squirrel", "she", "her"),
    ("turtle", "he", "his"),
]
NAMES = {
    "she": ["Mia", "Lily", "Rosa", "Nora", "Ella", "Ada", "Ruby", "Ivy", "Luna", "Zoë", "Léa"],
    "he": ["Tom", "Ben", "Max", "Leo", "Sam", "Finn", "Otto", "Jack", "Hugo", "Eli", "José"],
}
ADJECTIVES = ["little", "small", "brave", "shy", "curious", "happy", "sleepy", "clever", "kind"]
HOMES = ["a burrow", "a cottage", "a hollow tree", "a nest", "a little house", "a cave"]
PLACES = ["the river", "the forest", "the hill", "the meadow", "the pond", "the old mill"]
HABITS = [
    "play in the grass",
    "sing songs",
    "look at the clouds",
    "pick berries",
    "read books",
    "run very fast",
    "swim in the pond",
    "build towers of stones",
]
FINDS = [
    ("a red ball", "ball"),
    ("a shiny key", "key"),
    ("a blue kite", "kite"),
    ("a tiny boat", "boat"),
    ("a golden leaf", "leaf"),
    ("an old map", "map"),
    ("a wooden box", "box"),
    ("a green hat", "hat"),
]
HIDING = [
    "under a rock",
    "behind a tree",
    "in the tall grass",
    "next to the river",
    "on top of the hill",
    "inside an old boot",
]
THINGS_TO_COUNT = ["apples", "stars", "stones", "birds", "flowers", "clouds", "shells", "acorns"]
NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
FEELINGS = ["happy", "glad", "proud", "excited", "thankful"]
WEATHER = [
    "The sun was warm.",
    "It was a windy day.",
    "Rain fell softly on the roof.",
    "The sky was clear and blue.",
    "Snow covered the ground.",
]
ENDINGS = [
    "That night, {name} slept with a smile.",
    "And they stayed friends forever.",
    "From that day on, {name} was never lonely again.",
    "It was the best day of {poss} life.",
    "And then, tired and happy, {name} went home — the sky was full of stars.",
]


def character(rng: random.Random, avoid: str = "") -> dict[str, str]:
    kind, pronoun, poss = rng.choice(CHARACTERS)
    name = rng.choice([n for n in NAMES[pronoun] if n != avoid])
    return {"name": name, "kind": kind, "pron": pronoun, "Pron": pronoun.capitalize(), "poss": poss}


def tale(rng: random.Random) -> str:
    """One story of 8 to 12 sentences; the hero's name and pronouns stay consistent throughout."""
    return tale_and_facts(rng)[0]


def tale_and_facts(rng: random.Random) -> tuple[str, dict[str, str]]:
    """(one story, its facts): the facts are what corpora/make_tiny_dialogues.py asks about,
    "hero" (the name), "kind", "pron", "friend" (the friend's name), "found" ("a red ball"),
    "thing" ("ball"), "hiding" ("under a rock"), "day" and "said" (the hero's words)."""
    hero = character(rng)
    friend = character(rng, avoid=hero["name"])
    found, thing = rng.choice(FINDS)
    count = rng.randint(3, 10)
    start_day = rng.randrange(7)
    counted = rng.choice(THINGS_TO_COUNT)
    # drawn in the order the sentences use them, so each seed tells the story it always told
    adjective, home, place = rng.choice(ADJECTIVES), rng.choice(HOMES), rng.choice(PLACES)
    habit, weather, hiding = rng.choice(HABITS), rng.choice(WEATHER), rng.choice(HIDING)
    said = f"What a lovely {thing}!"
    lines = [
        f"Once upon a time, there was a {adjective} {hero['kind']} named {hero['name']}.",
        f"{hero['Pron']} lived in {home} near {place}.",
        f"Every day, {hero['name']} liked to {habit}.",
        weather,
        f"On {DAYS[start_day]}, {hero['name']} found {found} {hiding}.",
        f'"{said}" said {hero["name"]}.',
        f"{hero['Pron']} took the {thing} to {hero['poss']} friend {friend['name']} the {friend['kind']}.",
        f"Together they counted {counted}: {', '.join(NUMBERS[:count])}.",
        f"There were {NUMBERS[count - 1]} {counted} in all.",
    ]
    if rng.random() < 0.5:
        days = [DAYS[(start_day + i) % 7] for i in range(1, rng.randint(3, 6))]
        lines.append(f"They played with the {thing} on {', '.join(days)}.")
    if rng.random() < 0.5:
        lines.append(f"{friend['name']} was {rng.choice(FEELINGS)}, and so was {hero['name']}.")
    lines.append(rng.choice(ENDINGS).format(**hero))
    lines.append("The end.")
    facts = {
        "hero": hero["name"],
        "kind": hero["kind"],
        "pron": hero["pron"],
        "friend": friend["name"],
        "found": found,
        "thing": thing,
        "hiding": hiding,
        "day": DAYS[start_day],
        "said": said,
    }
    return " ".join(lines), facts


def write_atomic(path: Path, text: str) -> None:
    """`text` at `path`, written beside it and moved into place, so a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain open would make it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_corpus(path: Path, stories: int, seed: int) -> None:
    rng = random.Random(seed)
    write_atomic(path, "\n\n".join(tale(rng) for _ in range(stories)) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path(__file__).with_name("tiny_tales.txt"))
    parser.add_argument("--stories", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    write_corpus(args.output, args.stories, args.seed)


if __name__ == "__main__":
    main()
