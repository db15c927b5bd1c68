"""The one error type of `bpe/`: a mistake the user can fix, said in one line."""

from __future__ import annotations


class TokenizerError(Exception):
    """Bad tokenizer input: a missing or corrupt file, an impossible option, disallowed text."""


class DisallowedSpecialError(TokenizerError):
    """Text holds a special token the caller did not allow (tiktoken's policy); `token` names it.

    The message says how to read it as the special token (`allow`) or as plain text (`as_text`):
    in the Python API's words, or in a command's own flags (`advise`).

    >>> str(DisallowedSpecialError("<|end|>").advise("--allow-special", "--specials-as-text")).split("; ")[1:]
    ['to read it as that special token, pass --allow-special', 'to encode it as plain text, pass --specials-as-text']
    """

    def __init__(
        self, token: str, allow: str = "allowed_special (e.g. 'all')", as_text: str = "disallowed_special=()"
    ) -> None:
        self.token, self.allow, self.as_text = token, allow, as_text
        super().__init__(
            f"text contains the special token {token!r}, which is not allowed; to read it as that special token, "
            f"pass {allow}; to encode it as plain text, pass {as_text}"
        )

    def __reduce__(self):  # raised in a worker process, re-raised in the parent: keep the parts
        return type(self), (self.token, self.allow, self.as_text)

    def advise(self, allow: str, as_text: str) -> DisallowedSpecialError:
        """The same error, its advice in other words (a command's flags)."""
        return DisallowedSpecialError(self.token, allow, as_text)
