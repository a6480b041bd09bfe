"""`miles eval TARGET`: the path checks that need neither Prefect nor torch, run before either starts (a missing
path, a file or an empty dir is refused in about a second), and a run dir taken as its save dir
``<run_dir>/checkpoints``. What kind of target it is (checkpoint, save dir, export dir, snapshot) is decided
by miles_core/evaluation/discover.py inside the eval flow."""

from __future__ import annotations

from pathlib import Path

EXPECTED = "a checkpoint dir, a save dir, an HF export dir, one HF snapshot or a run dir"


def precheck(target: str) -> Path:
    """-> the dir to evaluate (a run dir: its checkpoints/); FileNotFoundError / NotADirectoryError naming the path."""
    path = Path(target).absolute()
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory; expected {EXPECTED}")
    if not path.is_dir():
        raise NotADirectoryError(f"{path}: is a file; expected {EXPECTED}")
    if _is_run_dir(path):
        return path / "checkpoints"
    if not any(path.iterdir()):
        raise FileNotFoundError(f"{path}: empty directory, nothing to evaluate; expected {EXPECTED}")
    return path


def _is_run_dir(path: Path) -> bool:
    """A run dir holds checkpoints/ (the default save dir) and is not itself a checkpoint or a snapshot."""
    return (path / "checkpoints").is_dir() and not (path / "meta.json").exists() and not (path / "config.json").exists()
