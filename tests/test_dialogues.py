"""The bundled dialogue corpus (corpora/make_tiny_dialogues.py) and its held-out accuracy measure
(pipeline/chat_accuracy.py).

The corpus: the committed files are the generator's output; every answer is read from its story
(checked against a plain reading of the story's sentences, not the generator's facts); the train
and held-out splits share no story, and the held-out stories are tiny_tales_test.txt's; no earlier
turn gives the scored answer away; every line reads with bpe/conversations.py and renders with
bpe/chat_template.py. The measure: the exact-match rule on hand-made cases and against a plain
reference on random answers, its refusals, and the trivial baseline's figure against a recount.
"""

from __future__ import annotations

import json
import os
import random
import re
import runpy
import subprocess
import sys
import unicodedata
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenkit.bpe import Tokenizer
from tokenkit.bpe.chat_template import END, ROLE_TOKENS, add_chat_tokens, render
from tokenkit.bpe.conversations import read_conversations
from tokenkit.pipeline import PipelineError
from tokenkit.pipeline import chat_accuracy as ca

CORPORA = Path(__file__).resolve().parents[1] / "corpora"
TRAIN = CORPORA / "tiny_dialogues.jsonl"
TEST = CORPORA / "tiny_dialogues_test.jsonl"
FOUND = re.compile(r"On (\w+), (\S+) found an? \w+ (\w+) (.+?)\. ")  # day, hero, thing, hiding place


@pytest.fixture(scope="module")
def gen() -> dict:
    return runpy.run_path(str(CORPORA / "make_tiny_dialogues.py"))


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def story_of(record: dict) -> str:
    first = next(m["content"] for m in record["messages"] if m["role"] == "user")
    return first[first.index("Once upon a time") : first.index("The end.") + len("The end.")]


def test_bundled_files_are_the_generators_output(tmp_path):
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    script = CORPORA / "make_tiny_dialogues.py"
    subprocess.run([sys.executable, str(script), "-o", str(train), "--held-out", str(test)], check=True)
    assert train.read_bytes() == TRAIN.read_bytes()
    assert test.read_bytes() == TEST.read_bytes()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left
    umask = os.umask(0)
    os.umask(umask)
    assert train.stat().st_mode & 0o777 == 0o666 & ~umask  # as a plain write makes it


def test_generator_refuses_the_held_out_seed(tmp_path):
    out = tmp_path / "train.jsonl"
    script = CORPORA / "make_tiny_dialogues.py"
    done = subprocess.run([sys.executable, str(script), "--seed", "4321", "-o", str(out)], capture_output=True)
    assert done.returncode != 0 and b"held-out" in done.stderr and not out.exists()


def test_facts_are_the_storys(gen):
    """tale_and_facts's facts read from its story's own sentences, and `tale` tells the same story."""
    tales = gen["tales"]
    a, b = random.Random(11), random.Random(11)
    for _ in range(300):
        story, f = tales.tale_and_facts(a)
        assert tales.tale(b) == story
        assert f"named {f['hero']}." in story and f"friend {f['friend']} the " in story
        assert f"On {f['day']}, {f['hero']} found {f['found']} {f['hiding']}." in story
        assert f'"{f["said"]}" said {f["hero"]}.' in story and f["found"].endswith(" " + f["thing"])


@pytest.mark.parametrize("path", [TRAIN, TEST], ids=["train", "held-out"])
def test_every_answer_is_read_from_its_story(path):
    """The last answer's key, against a plain reading of the story: the sentence where the hero
    finds the thing, the one that names the hero, the one where the hero speaks."""
    for r in records(path):
        story = story_of(r)
        day, hero, thing, hiding = FOUND.search(story).groups()
        expected = {"hero": hero, "found": thing, "said": thing, "where": hiding.split()[-1], "day": day}
        assert r["key"] == expected[r["kind"]], r
        assert f"named {hero}." in story and f'"What a lovely {thing}!" said {hero}.' in story
        assert r["key"].casefold() in ca.words(story)


@pytest.mark.parametrize("path", [TRAIN, TEST], ids=["train", "held-out"])
def test_every_answer_scores_right_and_nothing_gives_it_away(gen, path):
    """Each line's own last answer is right by the measure's rule (so a model answering as its
    data does scores 100%), and no turn before it names its key outside the story."""
    for r in records(path):
        choices = r.get("choices", gen["CHOICES"][r["kind"]])
        assert choices == gen["CHOICES"][r["kind"]]
        assert ca.is_right(r["messages"][-1]["content"], r["key"], choices), r
        story = story_of(r)
        before = [m["content"].replace(story, "") for m in r["messages"][:-1]]
        assert r["key"].casefold() not in ca.words(" ".join(before)), r


def test_splits_share_no_story():
    test_stories = [story_of(r) for r in records(TEST)]
    train_stories = {story_of(r) for r in records(TRAIN)}
    tales_test = (CORPORA / "tiny_tales_test.txt").read_text(encoding="utf-8").rstrip("\n").split("\n\n")
    tales = set((CORPORA / "tiny_tales.txt").read_text(encoding="utf-8").rstrip("\n").split("\n\n"))
    assert test_stories == [s for s in tales_test for _ in range(2)]  # two conversations a story, in order
    assert not train_stories & set(tales_test)
    assert not train_stories & tales and not set(tales_test) & tales
    assert len(train_stories) == len(records(TRAIN))  # a fresh story for each


def shape(text: str, story: str) -> str:
    """A question or answer with the story and its particulars replaced by their names: its phrasing."""
    day, hero, thing, hiding = FOUND.search(story).groups()
    friend = re.search(r"friend (\S+) the ", story).group(1)
    kind = re.search(r"(\w+) named ", story).group(1)
    text = text.replace(story, "STORY")
    text = re.sub(rf"\b(?i:the|an?) \w+ {thing}\b", "FOUND", text)
    for word, name in [(hiding, "HIDING"), (hiding.capitalize(), "HIDING"), (thing, "THING"), (hero, "HERO")]:
        text = re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", name, text)
    for word, name in [(friend, "FRIEND"), (day, "DAY"), (kind, "KIND"), ("He|She|he|she", "PRON")]:
        text = re.sub(rf"(?<!\w)({word})(?!\w)", name, text)
    return text


# How many phrasings the generator has for each kind's question and its answer
PHRASINGS = {"hero": (5, 4), "found": (5, 3), "where": (4, 3), "day": (4, 3), "said": (4, 3)}


def test_the_mix_of_kinds_phrasings_turns_and_system_messages(gen):
    test, train = records(TEST), records(TRAIN)
    assert Counter(r["kind"] for r in test) == dict.fromkeys(gen["KINDS"], 40)
    for rs in (test, train):
        turns = Counter(sum(m["role"] == "user" for m in r["messages"]) for r in rs)
        assert set(turns) == {1, 2, 3} and 0.2 < (turns[2] + turns[3]) / len(rs) < 0.5
        systems = sum(r["messages"][0]["role"] == "system" for r in rs) / len(rs)
        assert 0.03 < systems < 0.2
        for r in rs:  # turns about one story ask different questions
            questions = [shape(m["content"], story_of(r)) for m in r["messages"] if m["role"] == "user"]
            assert len(set(questions)) == len(questions), r
    frames, asked, answered = set(), {}, {}
    for r in train:
        story = story_of(r)
        first = next(shape(m["content"], story) for m in r["messages"] if m["role"] == "user")
        frames.add(first.split("STORY")[0])  # what comes before the story
        question = shape(r["messages"][-2]["content"], story).rsplit("\n", 1)[-1].removeprefix("Question: ")
        asked.setdefault(r["kind"], set()).add(question)
        answered.setdefault(r["kind"], set()).add(shape(r["messages"][-1]["content"], story))
    assert {k: (len(asked[k]), len(answered[k])) for k in asked} == PHRASINGS, (asked, answered)
    assert len(frames) == 4, frames  # the story introduced in four ways


@pytest.fixture(scope="module")
def chat_tok() -> Tokenizer:
    text = (CORPORA / "tiny_tales.txt").read_bytes()[:200_000]
    return add_chat_tokens(Tokenizer.train([text], vocab_size=400, special_tokens=["<|endoftext|>"], quiet=True))


@pytest.mark.parametrize("path", [TRAIN, TEST], ids=["train", "held-out"])
def test_every_line_reads_and_renders(chat_tok, path):
    """bpe/conversations.py reads every line, its extra fields ignored, and the template renders
    each: decoded, its ids are the template's text; the counted tokens are the answers' and ends."""
    raw = records(path)
    conversations = read_conversations(path)
    assert [[(m.role, m.content) for m in c.messages] for c in conversations] == [
        [(m["role"], m["content"]) for m in r["messages"]] for r in raw
    ]
    ends = chat_tok.special_tokens[END]
    for c in conversations:
        r = render(chat_tok, c)
        assert chat_tok.decode(r.ids) == "".join(f"{ROLE_TOKENS[m.role]}{m.content}{END}" for m in c.messages)
        answers = "".join(m.content for m in c.messages if m.role == "assistant")
        counted = r.ids[r.mask]
        assert chat_tok.decode(counted[counted != ends]) == answers
        assert (counted == ends).sum() == c.roles.count("assistant")


# The rule: (answer, key, choices, right?)
NAMES = ["Ben", "Tom", "Zoë", "Eli", "Ella"]
CASES = [
    ("Tom.", "Tom", NAMES, True),
    ("tom", "Tom", NAMES, True),  # case does not count
    ("TOM!!!", "Tom", NAMES, True),
    ('"Tom"', "Tom", NAMES, True),  # nor punctuation and quotes
    ("The hero is Tom the fox.", "Tom", NAMES, True),  # words outside the choices are free
    ("Tom, Tom, Tom.", "Tom", NAMES, True),  # one key word, said thrice
    ("Tom2", "Tom", NAMES, True),  # digits separate words
    ("Tom or Ben", "Tom", NAMES, False),  # hedging scores nothing
    ("Ben Tom Zoë Eli Ella", "Tom", NAMES, False),
    ("Tommy", "Tom", NAMES, False),  # whole words only
    ("T.o.m", "Tom", NAMES, False),
    ("Atom", "Tom", NAMES, False),
    ("", "Tom", NAMES, False),
    ("I do not know.", "Tom", NAMES, False),
    ("Ben.", "Tom", NAMES, False),
    ("Eli", "Ella", NAMES, False),
    ("Zoe", "Zoë", NAMES, False),  # accents count
    ("zoË.", "Zoë", NAMES, True),
    ("Zoe\u0308", "Zoë", NAMES, True),  # the same letter, decomposed: NFC makes it one
    ('Mia said, "What a lovely ball!"', "ball", ["ball", "key", "map"], True),
    ("A shiny key", "ball", ["ball", "key", "map"], False),
    ("under the rock", "rock", ["rock", "tree"], True),
    ("on Monday, not Tuesday", "Monday", ["Monday", "Tuesday"], False),
    ("on Monday", "monday", ["Monday", "Tuesday"], True),
]


@pytest.mark.parametrize(("answer", "key", "choices", "right"), CASES)
def test_exact_match_rule(answer, key, choices, right):
    assert ca.is_right(answer, key, choices) is right


def reference_right(answer: str, key: str, choices: list[str]) -> bool:
    """The rule written out plainly: which choices appear in the answer as a whole word, letters
    compared without case, a word edge being any character that is not a letter."""
    text = unicodedata.normalize("NFC", answer).casefold()

    def appears(word: str) -> bool:
        w = word.casefold()
        starts = [i for i in range(len(text) - len(w) + 1) if text[i : i + len(w)] == w]
        return any(
            (i == 0 or not text[i - 1].isalpha()) and (i + len(w) == len(text) or not text[i + len(w)].isalpha())
            for i in starts
        )

    named = {c.casefold() for c in choices if appears(c)}
    return named == {key.casefold()}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from([*NAMES, "Tommy", "tom", " ", ".", ",", '"', "e", "\u0308", "3", "-", "ß"]), max_size=8),
    st.sampled_from(NAMES),
)
def test_rule_against_plain_reference(pieces, key):
    answer = "".join(pieces)
    assert ca.is_right(answer, key, NAMES) == reference_right(answer, key, NAMES)


def test_accuracy_counts_by_kind_and_calls_the_answerer_with_the_prompt():
    items = ca.read_held_out(TEST)
    seen = []

    def answer(prompt) -> str:
        seen.append(prompt)
        return "Tom" if len(seen) % 2 else "nothing"

    result = ca.accuracy(items, answer)
    assert [p.roles[-1] for p in seen] == ["user"] * len(items)
    raw = records(TEST)
    assert [[m.content for m in p.messages] for p in seen] == [[m["content"] for m in r["messages"][:-1]] for r in raw]
    expect = [i % 2 == 0 and r["key"] == "Tom" for i, r in enumerate(raw)]
    assert [s.right for s in result.scored] == expect and result.right == sum(expect) and result.total == len(raw)
    assert sum(r for r, _ in result.by_kind.values()) == result.right
    assert {k: n for k, (_, n) in result.by_kind.items()} == Counter(r["kind"] for r in raw)
    gold = ca.accuracy(items, lambda p: raw[p.line - 1]["messages"][-1]["content"])
    assert gold.fraction == 1.0 and str(gold).startswith("100.0% (200 of 200: hero 40/40")
    with pytest.raises(TypeError, match="line 1"):
        ca.accuracy(items, lambda p: None)


def test_baseline_is_the_best_constant_answer_per_kind():
    items = ca.read_held_out(TEST)
    raw = records(TEST)
    floor = ca.baseline(items)
    best = 0  # every constant answer per kind, tried: the baseline scores the most of them
    for kind in {r["kind"] for r in raw}:
        keys = Counter(r["key"] for r in raw if r["kind"] == kind)
        best += max(keys[c] for c in raw[[r["kind"] for r in raw].index(kind)]["choices"])
        assert floor.by_kind[kind][0] == max(keys.values())
    assert floor.right == best == 38 and floor.total == 200  # 19.0%: docs/corpora.md quotes it
    assert ca.majority_keys(items)["day"] == "Tuesday"


def held_out_line(**fields) -> dict:
    line = {
        "messages": [{"role": "user", "content": "Story. Who?"}, {"role": "assistant", "content": "Tom."}],
        "kind": "hero",
        "key": "Tom",
        "choices": ["Ben", "Tom"],
    }
    return {k: v for k, v in {**line, **fields}.items() if v is not None}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", ":2 is not valid JSON .*; give one JSON object per line"),
        (json.dumps([1]), ':2: not an object with "messages"'),
        (json.dumps(held_out_line(messages=[{"role": "assistant", "content": "Tom."}])), ":2: .*user's turn"),
        (json.dumps(held_out_line(messages=[{"role": "user", "content": "Who?"}])), ":2: .*assistant's answer"),
        (json.dumps(held_out_line(kind=None)), ':2: no "kind"'),
        (json.dumps(held_out_line(key="Tom Ben")), ':2: "key" is not one word'),
        (json.dumps(held_out_line(key=3)), ':2: "key" is not one word'),
        (json.dumps(held_out_line(choices="Tom")), ':2: "choices" is not a list'),
        (json.dumps(held_out_line(choices=["Ben", "Max"])), ":2: the key 'Tom' is not among"),
    ],
)
def test_held_out_file_refusals_name_the_line(tmp_path, line, message):
    path = tmp_path / "held.jsonl"
    path.write_text(json.dumps(held_out_line()) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(PipelineError, match=message) as err:
        ca.read_held_out(path)
    assert str(err.value).startswith(f"{path}:2") and "\n" not in str(err.value)


def test_held_out_file_refusals_of_the_file(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(PipelineError, match="holds no conversations"):
        ca.read_held_out(empty)
    with pytest.raises(PipelineError, match="not a regular file"):
        ca.read_held_out(tmp_path)
    with pytest.raises(PipelineError, match="no such file"):
        ca.read_held_out(tmp_path / "missing.jsonl")
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(held_out_line()).encode() + b"\r\n")
    (item,) = ca.read_held_out(bom)
    assert (item.kind, item.key, item.choices, item.answer, item.line) == ("hero", "Tom", ("Ben", "Tom"), "Tom.", 1)


def test_module_examples():
    import doctest

    assert doctest.testmod(ca).failed == 0
