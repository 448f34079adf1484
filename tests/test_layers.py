"""The house's floors: verl/utils and verl/protocol.py are the lowest; they import no other part of verl. The
algorithms (verl/algorithms) stand on them alone, below the workers and the trainer."""

import ast
from pathlib import Path

import pytest

VERL = Path(__file__).resolve().parents[1] / "verl"


def verl_imports(path: Path) -> set[str]:
    """The verl.* modules a file imports, at any depth (lazy imports inside functions count)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name == "verl" or name.startswith("verl.")}


@pytest.mark.parametrize("path", sorted(VERL.glob("utils/**/*.py")) + [VERL / "protocol.py"],
                         ids=lambda p: str(p.relative_to(VERL)))
def test_the_lowest_floor_imports_nothing_above_it(path):
    above = {name for name in verl_imports(path) if not name.startswith("verl.utils")}
    assert not above, f"{path.relative_to(VERL)} imports {sorted(above)}: verl/utils must stay a leaf"


@pytest.mark.parametrize("path", sorted(VERL.glob("algorithms/**/*.py")), ids=lambda p: str(p.relative_to(VERL)))
def test_the_algorithms_import_only_verl_utils(path):
    above = {name for name in verl_imports(path) if not name.startswith(("verl.utils", "verl.algorithms"))}
    assert not above, (f"{path.relative_to(VERL)} imports {sorted(above)}: verl/algorithms may import torch, numpy, "
                       "the standard library and verl/utils only (the workers and the trainer import it, not the "
                       "reverse)")


@pytest.mark.parametrize("path", sorted(VERL.glob("workers/**/*.py")), ids=lambda p: str(p.relative_to(VERL)))
def test_the_workers_import_nothing_of_the_trainer(path):
    above = sorted(name for name in verl_imports(path) if name.startswith("verl.trainer"))
    assert not above, (f"{path.relative_to(VERL)} imports {above}: the workers take the algorithms from "
                       "verl/algorithms, never from verl/trainer")
