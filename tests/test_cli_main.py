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
