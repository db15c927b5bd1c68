"""Encoding with a listed vocabulary (Llama 3's kind of tokenizer.json) next to HF tokenizers, in one run.

    flock /tmp/tokenkit-bench.lock python bench/listed.py [--repeats 3] [--corpus FILE]

Meta's Llama 3 tokenizer.json is not at hand, so one is made as it was: GPT-2's ranks
(../shared/data/gpt2/gpt2.tiktoken) through transformers' own tiktoken converter, which writes a
merge for every split of a token into two tokens (more merges than tokens, some out of order) and
sets ignore_merges. Timed, taking turns, one thread each, text in memory, a fresh tokenizer each
time (cold cache), loading the file timed apart from encoding: tk with that file imported (a
listed vocabulary, `bpe/layout.py`), HF tokenizers with the same file, and tk with GPT-2's own
files (the derived layout) for scale. tk's ids are checked against HF's first. Medians of
--repeats; HF/this = HF's encode time / this one's (> 1: faster than HF). Needs
`pip install -e '.[bench]' transformers`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / ".." / "shared" / "data"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--corpus", type=Path, default=DATA / "wikitext2" / "valid.txt")
    args = parser.parse_args()
    import tokenizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from tokenkit.bpe import Tokenizer

    text = args.corpus.read_text(encoding="utf-8")
    mb = len(text.encode("utf-8")) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        TikTokenConverter(vocab_file=str(DATA / "gpt2" / "gpt2.tiktoken"), pattern="gpt2").converted().save(str(path))
        # the converter's pattern argument is a regex: write GPT-2's as ByteLevel's own, as tiktoken's GPT-2 has it
        data = json.loads(path.read_text(encoding="utf-8"))
        data["pre_tokenizer"] = {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": True,
        }
        path.write_text(json.dumps(data), encoding="utf-8")
        merges, tokens = len(data["model"]["merges"]), len(data["model"]["vocab"])
        listed = Tokenizer.from_hf(path)
        hf = tokenizers.Tokenizer.from_file(str(path))
        assert listed.listed and listed.encode(text) == hf.encode(text).ids, "ids differ from HF tokenizers'"
        print(f"{args.corpus.name}: {mb:.2f} MB; tokenizer.json: {tokens:,} tokens, {merges:,} merges, "
              f"merges in order: {listed._layout.monotone}")  # fmt: skip

        def load_ours():
            return Tokenizer.from_hf(path)

        def load_gpt2():
            return Tokenizer.from_gpt2(DATA / "gpt2" / "vocab.json", DATA / "gpt2" / "merges.txt")

        def load_theirs():
            return tokenizers.Tokenizer.from_file(str(path))

        names = ["tk, listed (Llama 3's kind)", "HF tokenizers, same file", "tk, GPT-2's files (derived)"]
        loads: dict[str, list[float]] = {name: [] for name in names}
        encodes: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):  # taking turns; a fresh tokenizer each time: its caches start empty
            for name, load in zip(names, (load_ours, load_theirs, load_gpt2), strict=True):
                start = time.perf_counter()
                tok = load()
                loaded = time.perf_counter()
                tok.encode(text)
                loads[name].append(loaded - start)
                encodes[name].append(time.perf_counter() - loaded)
    hf_encode = statistics.median(encodes[names[1]])
    for name in names:
        load, encode = statistics.median(loads[name]), statistics.median(encodes[name])
        print(f"  {name:30s} load {load:5.2f} s   encode {encode:5.2f} s  {mb / encode:5.1f} MB/s  "
              f"HF/this {hf_encode / encode:4.2f}x")  # fmt: skip
    print(f"encode, HF time / tk listed time: {hf_encode / statistics.median(encodes[names[0]]):.2f}x")


if __name__ == "__main__":
    main()
