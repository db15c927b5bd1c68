"""Write `tiny_dialogues.jsonl` and `tiny_dialogues_test.jsonl`: questions about tiny tales, answered from them.

The default corpus's sibling, for chat fine-tuning: each conversation is a story of
corpora/make_tiny_tales.py's grammar (its own generator, imported), then questions about it,
answered from the story. Five kinds of question, each with several phrasings and answers:

    hero    who the hero is                   key: the hero's name          ("Tom")
    found   what the hero found               key: the thing's word         ("ball")
    where   where it was found                key: the hiding place's word  ("rock", of "under a rock")
    day     on which day                      key: the day                  ("Monday")
    said    what the hero said                key: the thing's word         ("ball", of "What a lovely ball!")

One line a conversation, `{"messages": [...], "kind": ..., "key": ...}`, and in the held-out split
`"choices": [...]` too: the messages in the format of bpe/conversations.py (which ignores the other
fields); the first user
message holds the story then the first question; about a third of the conversations ask two or
three questions about the same story, and about one in ten opens with a system message. "kind"
and "key" are those of the last question, the one pipeline/chat_accuracy.py scores, and "choices"
every key that kind of question can have, so a scorer can tell a hedged answer ("Tom or Ben") from
an answer. No earlier turn's text names the last question's key (a question "Where did Tom find
the ball?" before "What did Tom find?" would give the answer away); only the story does.

- tiny_dialogues.jsonl (train): 4,000 conversations about fresh stories (seed 2468, never a story
  of the held-out split);
- tiny_dialogues_test.jsonl (held out): 200 conversations, two about each story of
  corpora/tiny_tales_test.txt (seed 4321; none of them in tiny_tales.txt either), each kind of
  question last in 40 of them.

Licence: this file, tiny_dialogues.jsonl and tiny_dialogues_test.jsonl are dedicated to the public
domain under CC0 1.0 (https://creativecommons.org/publicdomain/zero/1.0/).

    python corpora/make_tiny_dialogues.py          # rewrites both files
    python corpora/make_tiny_dialogues.py --conversations 100 -o /tmp/d.jsonl --held-out /tmp/t.jsonl

Standard library only; the same seed writes the same bytes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("make_tiny_tales", HERE / "make_tiny_tales.py")
tales = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tales)  # a sibling script, not a package: imported by its path

TRAIN_SEED = 2468
TRAIN_CONVERSATIONS = 4000
HELD_OUT_SEED = 4321  # tiny_tales_test.txt's
HELD_OUT_STORIES = 100
HELD_OUT_PER_STORY = 2
KINDS = ("hero", "found", "where", "day", "said")


def hiding_word(hiding: str) -> str:
    """The key of a hiding place: its last word ("under a rock" -> "rock")."""
    return hiding.rsplit(" ", 1)[1]


THINGS = sorted({thing for _, thing in tales.FINDS})
CHOICES = {
    "hero": sorted({name for names in tales.NAMES.values() for name in names}),
    "found": THINGS,
    "where": sorted({hiding_word(h) for h in tales.HIDING}),
    "day": list(tales.DAYS),
    "said": THINGS,
}

SYSTEMS = [
    "Answer questions about the story in one short sentence.",
    "You answer questions about stories, using only what the story says.",
    "Read the story and answer briefly.",
]
FRAMES = [  # the first user message: the story, then the question
    "{story}\n\n{question}",
    "Read this story:\n\n{story}\n\n{question}",
    "Here is a story.\n\n{story}\n\nQuestion: {question}",
    "Story: {story}\n\n{question}",
]


def key(kind: str, facts: dict[str, str]) -> str:
    """The word an answer to a question of `kind` about the story of `facts` must give."""
    if kind == "hero":
        return facts["hero"]
    if kind in ("found", "said"):
        return facts["thing"]
    if kind == "where":
        return hiding_word(facts["hiding"])
    return facts["day"]


def questions(kind: str, f: dict[str, str]) -> list[tuple[str, str]]:
    """Every (question, answer) phrasing of `kind` about the story of facts `f`."""
    name, thing, found = f["hero"], f["thing"], f["found"]
    the_found = "the " + found.split(" ", 1)[1]  # "a red ball" -> "the red ball"
    pron = f["pron"].capitalize()
    if kind == "hero":
        qs = ["Who is the hero of this story?", "Who is the story about?", "What is the main character's name?"]
        qs += [f"Who found {the_found}?", f"Who found {the_found} on {f['day']}?"]
        answers = [f"{name}.", f"The hero is {name} the {f['kind']}.", f"It is about {name} the {f['kind']}."]
        answers += [f"{name} found it."]
    elif kind == "found":
        qs = [f"What did {name} find?", "What did the hero find?", f"What did {name} find on {f['day']}?"]
        qs += [f"What was found {f['hiding']}?", f"What did {name} take to {f['friend']}?"]
        answers = [f"{found[0].upper()}{found[1:]}.", f"{name} found {found}.", f"It was {found}."]
    elif kind == "where":
        qs = [f"Where did {name} find the {thing}?", f"Where was the {thing}?", f"Where was {the_found} found?"]
        qs += [f"Where did the hero find the {thing}?"]
        hiding = f["hiding"]
        answers = [f"{hiding[0].upper()}{hiding[1:]}.", f"It was {hiding}.", f"{name} found it {hiding}."]
    elif kind == "day":
        qs = [f"On which day did {name} find the {thing}?", f"When did {name} find the {thing}?"]
        qs += [f"What day was it when {name} found the {thing}?", f"On what day was {the_found} found?"]
        answers = [f"On {f['day']}.", f"{f['day']}.", f"{name} found it on {f['day']}."]
    else:
        qs = [f"What did {name} say?", "What did the hero say?", f"What did {name} say on {f['day']}?"]
        qs += [f"What were {name}'s words when {f['pron']} found it?"]
        said = f["said"]
        answers = [f'"{said}"', f'{name} said, "{said}"', f'{pron} said: "{said}"']
    return [(q, a) for q in qs for a in answers]


def words(text: str) -> set[str]:
    """The words of `text`: its runs of letters, case-folded (as pipeline/chat_accuracy.py reads an
    answer; the generator's text is NFC already)."""
    out, word = set(), []
    for ch in text + " ":
        if ch.isalpha():
            word.append(ch)
        elif word:
            out.add("".join(word).casefold())
            word = []
    return out


def conversation(story: str, facts: dict[str, str], last: str, turns: int, system: bool, rng: random.Random) -> dict:
    """One conversation about `story`: up to `turns` questions of distinct kinds, the last of kind
    `last`, no earlier turn naming the last one's key (fewer when too few kinds can keep it)."""
    secret = key(last, facts).casefold()
    kinds = [k for k in KINDS if k != last]
    rng.shuffle(kinds)
    pairs = []
    for kind in kinds:  # earlier turns: the first kinds with a phrasing that keeps the secret
        if len(pairs) == turns - 1:
            break
        safe = [qa for qa in questions(kind, facts) if secret not in words(qa[0]) | words(qa[1])]
        if safe:
            pairs.append(rng.choice(safe))
    pairs.append(rng.choice([qa for qa in questions(last, facts) if secret not in words(qa[0])]))
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}] if system else []
    for i, (question, answer) in enumerate(pairs):
        content = rng.choice(FRAMES).format(story=story, question=question) if i == 0 else question
        messages += [{"role": "user", "content": content}, {"role": "assistant", "content": answer}]
    return {"messages": messages, "kind": last, "key": key(last, facts)}


def held_out() -> list[dict]:
    """The held-out split: HELD_OUT_PER_STORY conversations about each of tiny_tales_test.txt's
    stories, the last question's kind cycling so that each kind is last equally often."""
    stories, ask = random.Random(HELD_OUT_SEED), random.Random(f"held-out questions {HELD_OUT_SEED}")
    out = []
    for i in range(HELD_OUT_STORIES):
        story, facts = tales.tale_and_facts(stories)
        for j in range(HELD_OUT_PER_STORY):
            last = KINDS[(HELD_OUT_PER_STORY * i + j) % len(KINDS)]
            turns = 1 if ask.random() < 0.65 else ask.choice((2, 3))
            record = conversation(story, facts, last, turns, ask.random() < 0.1, ask)
            out.append({**record, "choices": CHOICES[last]})
    return out


def held_out_stories() -> set[str]:
    rng = random.Random(HELD_OUT_SEED)
    return {tales.tale(rng) for _ in range(HELD_OUT_STORIES)}


def train(n: int, seed: int) -> list[dict]:
    """`n` conversations, each about a fresh story of `seed` that is not a held-out one."""
    stories, ask = random.Random(seed), random.Random(f"train questions {seed}")
    avoid = held_out_stories()
    out = []
    while len(out) < n:
        story, facts = tales.tale_and_facts(stories)
        if story in avoid:
            continue
        turns = 1 if ask.random() < 0.65 else ask.choice((2, 3))
        out.append(conversation(story, facts, ask.choice(KINDS), turns, ask.random() < 0.1, ask))
    return out


def jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=HERE / "tiny_dialogues.jsonl")
    parser.add_argument("--held-out", type=Path, default=HERE / "tiny_dialogues_test.jsonl")
    parser.add_argument("--conversations", type=int, default=TRAIN_CONVERSATIONS, help="in the train split")
    parser.add_argument("--seed", type=int, default=TRAIN_SEED, help="the train split's stories")
    args = parser.parse_args()
    if args.conversations < 1:
        parser.error("--conversations must be at least 1")
    if args.seed == HELD_OUT_SEED:
        parser.error(f"--seed {HELD_OUT_SEED} is the held-out split's; give another")
    for path in (args.output, args.held_out):
        if not path.parent.is_dir() or path.is_dir():
            parser.error(f"{path} is not a file in an existing folder; give one")
    tales.write_atomic(args.output, jsonl(train(args.conversations, args.seed)))
    tales.write_atomic(args.held_out, jsonl(held_out()))


if __name__ == "__main__":
    main()
