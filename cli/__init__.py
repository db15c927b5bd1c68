"""The `tk` command line: a thin layer that parses flags, calls the Python API and prints."""
