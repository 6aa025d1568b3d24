"""``ql3 serve`` refuses bad worker settings as usage errors before it touches anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from ql3.cli.main import main


@pytest.mark.parametrize(
    "args",
    [
        ["--slots", "0"],
        ["--slots", "1025"],
        ["--slots", "many"],
        ["--worker-id", "bad id"],
        ["--worker-id", "-x"],
    ],
)
def test_bad_worker_settings_exit_64_and_create_nothing(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("QL3_HOME", str(home))

    assert main(["serve", *args]) == 64
    assert not home.exists()
