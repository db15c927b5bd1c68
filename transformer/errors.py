"""The one error type of `transformer/`: a mistake the user can fix, said in one line."""


class ModelError(Exception):
    """Bad model input: an invalid config, ids out of range, a corrupt or foreign weights file."""
