"""The one error type of `pipeline/`: a mistake the user can fix, said in one line."""


class PipelineError(Exception):
    """Bad pipeline input: a missing run directory, contradicting flags, a diverged run."""
