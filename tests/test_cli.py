"""cli: the one line a command ends with when run by a Python without the project's packages."""

import pytest

from cli import exit_outside_venv


@pytest.mark.parametrize(("instead", "expected"), [
    ("", "run `.venv/bin/python -m model.evaluate` after `make install`"),
    ("make run", "run `make run` (or `.venv/bin/python -m model.evaluate`) after `make install`"),
])
def test_a_command_run_by_the_wrong_python_ends_with_one_line_naming_what_to_run_and_exit_2(capsys, instead,
                                                                                          expected):
    with pytest.raises(SystemExit) as stopped:
        exit_outside_venv(ModuleNotFoundError("No module named 'torch'", name="torch"), "model.evaluate", instead)
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith("python -m model.evaluate needs torch, which this Python (")
    assert line.endswith(expected)
