"""Names pipeline/ accepts that the command line offers as choices, and their bounds, in a module
that imports nothing: `tk CMD --help` lists them before NumPy, the model and the codec load.

What it does not do: act on a name (pipeline/sources.py reads a corpus under a special-token
policy, pipeline/views.py computes each view, pipeline/run.py generates).
"""

# The special-token policies by name: keyword arguments of `Tokenizer.encode`, as cli/specials.py's
# flags give them. A corpus's policy is part of what its token files were made from.
SPECIALS = {
    "refuse": {"allowed_special": (), "disallowed_special": "all"},  # the default: such text is an error
    "allow": {"allowed_special": "all", "disallowed_special": "all"},  # --allow-special
    "text": {"allowed_special": (), "disallowed_special": ()},  # --specials-as-text
}
# How each policy is asked for on the command line, for messages.
SPECIAL_FLAGS = {
    "refuse": "neither --allow-special nor --specials-as-text",
    "allow": "--allow-special",
    "text": "--specials-as-text",
}

# The page's views (docs/serve.md).
VIEWS = ("tokens", "bpe", "attention", "lens", "next", "chat", "training", "model", "examples")

MAX_NEW_TOKENS = 1_000_000  # tokens one generation may ask for: each is a forward pass and a list entry
