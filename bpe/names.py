"""Names bpe/ accepts that the command line offers as choices, in a module that imports nothing,
so that `tk CMD --help` lists them before NumPy and the codec load.

What it does not do: say what a name means (bpe/formats.py writes each export format).
"""

EXPORT_FORMATS = ("gpt2", "hf", "tiktoken")  # bpe/formats.py's export_files writes each
