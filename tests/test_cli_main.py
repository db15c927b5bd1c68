"""The `tk` group itself: help, version, and the one-line error for an unknown command."""

from tokenkit.cli.main import main


def test_bare_tk_prints_the_help_and_succeeds(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Usage: tk")
    for command in ("bpe-train", "encode", "train-model", "predict-next", "pipeline", "explain"):
        assert command in out


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("tokenkit, version ")


def test_unknown_command_is_one_line_exit_1(capsys):
    assert main(["tokenise"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: No such command 'tokenise'")


def test_a_reader_that_stops_early_gets_no_error_line(tmp_path):
    # `tk encode ... --show | head -1`: the pipe breaks under tk's output; that is the reader's
    # choice, not an error to report ("Broken pipe; check the path ..." was printed before)
    import subprocess
    import sys
    from pathlib import Path

    from tokenkit.bpe import Tokenizer

    tok = tmp_path / "tok.safetensors"
    Tokenizer([]).save(tok)  # bytes only: one token per byte, so the listing is long
    text = "lorem ipsum " * 10_000  # 120 KB: over any pipe's buffer, under the argument limit
    tk = [sys.executable, "-m", "tokenkit", "encode", "-t", str(tok), text, "--show"]
    writer = subprocess.Popen(tk, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=Path(__file__).parents[1])
    first = writer.stdout.readline()
    writer.stdout.close()  # the reader stops
    err = writer.stderr.read().decode()
    assert writer.wait(60) == 1 and first.strip().startswith(b"108") and err == "", err
