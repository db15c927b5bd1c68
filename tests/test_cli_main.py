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


def test_the_lazy_table_names_each_command_in_its_module_with_its_own_help():
    """`tk --help` lists the commands from cli/commands.py's table without importing them: each
    entry must be the command its module defines, with the first sentence of its own help."""
    import importlib

    import click

    from tokenkit.cli.commands import COMMANDS, cli

    defined = {}
    for module in {module for module, _ in COMMANDS.values()}:
        for command in importlib.import_module(f"tokenkit.cli.{module}").COMMANDS:
            defined[command.name] = (module, command)
    assert defined.keys() == COMMANDS.keys()
    ctx = click.Context(cli)
    for name, (module, sentence) in COMMANDS.items():
        assert defined[name][0] == module
        command = cli.get_command(ctx, name)
        assert command is defined[name][1]
        for limit in (30, 45, 60, 300):
            listed = click.Command(name, help=sentence).get_short_help_str(limit)
            assert listed == command.get_short_help_str(limit), name


def _modules_after(args: list[str], env: dict | None = None) -> tuple[str, set[str]]:
    """(stdout, the modules loaded) of `python -m tokenkit ARGS` in a fresh process."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, runpy\n"
        "sys.argv = ['tk', *sys.argv[1:]]\n"
        "try:\n    runpy.run_module('tokenkit', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "sys.stdout.flush()\n"
        "sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    modules = done.stderr.rsplit("MODULES ", 1)[1].split()
    return done.stdout, set(modules)


COMMAND_MODULES = {
    "numpy",
    *(f"tokenkit.cli.{m}" for m in ("tokenizer_commands", "train_commands", "model_commands", "serve")),
    *(f"tokenkit.cli.{m}" for m in ("info_commands", "hf_commands", "explain_commands")),
}


def test_version_help_and_completion_load_no_command_and_no_numpy():
    out, modules = _modules_after(["--version"])
    assert out.startswith("tokenkit, version") and not modules & COMMAND_MODULES, modules & COMMAND_MODULES
    out, modules = _modules_after(["--help"])
    assert "train-model" in out and not modules & COMMAND_MODULES, modules & COMMAND_MODULES
    out, modules = _modules_after([], env={"_TK_COMPLETE": "bash_complete", "COMP_WORDS": "tk en", "COMP_CWORD": "1"})
    assert "encode" in out and not modules & COMMAND_MODULES, modules & COMMAND_MODULES


def test_each_command_s_help_loads_no_numpy():
    """`tk CMD --help` imports that command's module only; each imports NumPy, the codec and the
    model inside the functions that run."""
    from tokenkit.cli.commands import COMMANDS

    for name in COMMANDS:
        out, modules = _modules_after([name, "--help"])
        assert out.startswith(f"Usage: tk {name}"), out
        assert "numpy" not in modules, name


def test_encoding_a_text_loads_no_progress_bar_pool_or_model(tmp_path):
    """`tk encode -t TOK TEXT` draws no bar, starts no workers and runs no model: tqdm,
    multiprocessing and the model's code stay unloaded (common/progress.py imports tqdm on the
    first bar)."""
    from tokenkit.bpe import Tokenizer

    tok = tmp_path / "tok.safetensors"
    Tokenizer([]).save(tok)
    out, modules = _modules_after(["encode", "-t", str(tok), "hi"])
    assert out.split() == ["104", "105"]
    assert not modules & {"tqdm", "multiprocessing", "tokenkit.transformer.model", "tokenkit.pipeline.train"}


def test_progress_bars_hide_when_quiet_or_not_a_terminal_and_lines_pass_through(capsys, monkeypatch):
    import io
    import sys

    from tokenkit.common import progress

    with progress.bar(total=10, desc="x", quiet=True) as bar:
        assert bar.disable
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    with progress.bar(total=10, desc="x") as bar:
        assert bar.disable
    monkeypatch.undo()
    progress.print_line("a line")
    assert capsys.readouterr().err == "a line\n"
