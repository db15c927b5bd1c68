"""Byte-level BPE: text <-> token ids.

What it does: trains a tokenizer on any bytes (ids 0-255 are the bytes, so nothing is ever
unknown), encodes and decodes text with it, honours special tokens only where the caller allows
them, and reads/writes `tokenizer.safetensors` plus GPT-2's vocabulary files, Hugging Face's
tokenizer.json and tiktoken's rank files (an imported tokenizer gives its library's exact ids).

What it deliberately does not do: normalise text (no lowercasing, no Unicode normalisation, no
byte fallback: the exact bytes go in and come back out), know anything about models, or touch
files outside `bpe/io.py` (tokenizer and ids files), `bpe/library_files.py` (other libraries'
tokenizer files) and `bpe/corpus.py` with `bpe/streams.py` (corpora: files, directories, pipes,
compressed files, JSONL).

Reading order for a newcomer: merge.py (the merge loop), trainer.py (learning merges), then
tokenizer.py (the codec and its special-token policy) and text_encoder.py (its caches).

>>> from tokenkit.bpe import Tokenizer
>>> tok = Tokenizer.train([b"aaabdaaabac"], vocab_size=259, min_frequency=1, quiet=True)
>>> tok.merges
[(97, 97), (97, 98), (256, 257)]
>>> tok.decode(tok.encode("aaabdaaabac"))
'aaabdaaabac'
"""

from tokenkit.common.lazy import lazy_names

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; type checkers read the block
if TYPE_CHECKING:
    from tokenkit.bpe.corpus import Corpus
    from tokenkit.bpe.errors import DisallowedSpecialError, TokenizerError
    from tokenkit.bpe.tokenizer import Tokenizer

__all__ = ["Corpus", "DisallowedSpecialError", "Tokenizer", "TokenizerError"]

# imported on first use (common/lazy.py): `tk --help` must not wait for NumPy
_HOMES = {"Corpus": "corpus", "DisallowedSpecialError": "errors", "Tokenizer": "tokenizer", "TokenizerError": "errors"}
__getattr__, __dir__ = lazy_names(__name__, _HOMES)
