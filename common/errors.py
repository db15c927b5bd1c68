"""The one error type of `common/`: a file that cannot be written or read safely, said in one line."""


class FileError(Exception):
    """A write that failed (read-only, full disk, no permission) or a file that is not safe to read
    (malformed, nested too deep, sizes that do not fit the file); the message names the path."""
