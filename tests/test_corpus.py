"""The default corpus is exactly what its generator writes, so anyone can rebuild and audit it."""

import random
import runpy
from pathlib import Path

CORPORA = Path(__file__).resolve().parents[1] / "corpora"


def test_committed_corpus_equals_generator_output(tmp_path):
    generator = runpy.run_path(str(CORPORA / "make_tiny_tales.py"))
    rebuilt = tmp_path / "tiny_tales.txt"
    generator["write_corpus"](rebuilt, stories=2000, seed=1234)
    assert rebuilt.read_bytes() == (CORPORA / "tiny_tales.txt").read_bytes()


def test_stories_keep_their_hero_and_count_in_order():
    generator = runpy.run_path(str(CORPORA / "make_tiny_tales.py"))
    rng = random.Random(7)
    for _ in range(200):
        story = generator["tale"](rng)
        name = story.split(" named ", 1)[1].split(".", 1)[0]
        assert f"said {name}." in story
        counted = story.split("Together they counted ", 1)[1].split(".", 1)[0]
        numbers = counted.split(": ", 1)[1].split(", ")
        assert numbers == generator["NUMBERS"][: len(numbers)]
        assert story.endswith("The end.")
