"""The one error type of `bpe/`: a mistake the user can fix, said in one line."""


class TokenizerError(Exception):
    """Bad tokenizer input: a missing or corrupt file, an impossible option, disallowed text."""
