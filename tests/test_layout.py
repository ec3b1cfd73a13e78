"""The tree's shape: utils/ is a few rooms named by job, imports run one way, and no module imports in a circle."""
from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UTILS = REPO / "utils"
COMMANDS = {"train", "test", "detect", "export", "validator", "hubconf"}


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside functions, as dotted names."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from utils.data import labels`
    return out


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def project_graph() -> dict[str, set[str]]:
    files = [*UTILS.rglob("*.py"), *(REPO / "models").glob("*.py")]
    names = {module_name(f) for f in files}
    return {module_name(f): {m for m in imports_of(f) if m in names and m != module_name(f)} for f in files}


def room(module: str) -> str:
    """'utils.data.labels' -> 'utils.data'; plumbing 'utils.files' -> 'utils.files'; 'models.yolo' -> 'models'."""
    parts = module.split(".")
    if parts[0] == "models" or len(parts) == 1:
        return parts[0]
    return ".".join(parts[:2]) if len(parts) > 2 or (UTILS / parts[1]).is_dir() else module


def test_utils_is_a_few_rooms_and_a_little_plumbing():
    rooms = sorted(p.name for p in UTILS.iterdir() if p.is_dir() and (p / "__init__.py").is_file())
    plumbing = sorted(p.stem for p in UTILS.glob("*.py") if p.stem != "__init__")
    assert rooms == ["data", "engine", "interop", "report"]
    assert len(plumbing) <= 8, plumbing  # the room-less files stay few; a new job gets a room
    for r in rooms:
        assert ast.get_docstring(ast.parse((UTILS / r / "__init__.py").read_text())), f"utils/{r} says what it holds"


def test_plumbing_imports_no_room_and_utils_imports_no_command():
    graph = project_graph()
    for mod, deps in graph.items():
        if mod.startswith("utils.") and room(mod) == mod:  # plumbing
            assert all(room(d) == d for d in deps if d.startswith("utils.")), (mod, deps)
        if mod.startswith("utils"):
            assert not {d.split(".")[0] for d in deps} & (COMMANDS | {"models"}), (mod, deps)
    for f in UTILS.rglob("*.py"):
        assert not {m.split(".")[0] for m in imports_of(f)} & COMMANDS, f


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(n: str, path: list[str]) -> list[str] | None:
        state[n] = 1
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return path[path.index(d):] + [d] if d in path else [n, d]
            if d not in state and (c := visit(d, path + [d])):
                return c
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n, [n])):
            return c
    return None


def test_no_import_circle_between_modules_or_rooms():
    graph = project_graph()
    assert find_cycle(graph) is None, find_cycle(graph)
    rooms: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        rooms.setdefault(room(mod), set()).update(room(d) for d in deps if room(d) != room(mod))
    assert find_cycle(rooms) is None, find_cycle(rooms)


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_readme_is_a_guide_whose_layout_map_matches_the_tree():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "pip install -r requirements-dev.txt && python train.py" in text and "python -m pytest -q" in text
    # no study jargon on the user's page: mode names and study words live in docs/
    for word in ("fp32-lr2", "bf16-warm32", "stall rule", "warm6", "RECIPE_TABLE", "issue"):
        assert word not in text, word
    for room in ("data", "engine", "report", "interop"):
        assert f"utils/{room}/" in text
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (REPO / link).exists(), link
