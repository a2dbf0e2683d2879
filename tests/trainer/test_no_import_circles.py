"""No two modules of railyard, railyard_local or railyard_trainer import each other, directly or
in a loop (issue 36): a circle means neither side can be read, tested or moved without the other.

The import graph is grimp's (what import-linter checks the layer contracts on), with the imports
under ``if TYPE_CHECKING:`` left out: they are annotations only and never run. Imports inside
functions count: they run too. Each loop still allowed is listed in ``ALLOWED`` with the reason;
a new loop, or a new module joining an allowed one, fails here.
"""

from __future__ import annotations

import grimp

#: Each import loop still allowed (its modules, exactly), with why.
ALLOWED: dict[frozenset[str], str] = {
    frozenset({"railyard_local.apiserver.admission", "railyard_local.apiserver.engine"}): (
        "the embedded API server's admission plugins take the engine as an argument (typed under "
        "TYPE_CHECKING) and call engine.random_suffix from inside a function; builtins and crd "
        "reach the engine under TYPE_CHECKING only"
    ),
}


def import_loops(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[frozenset[str]] = []
    for root in modules:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(edges[v]):
                work.append((v, i + 1))
                w = edges[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == v:
                        break
                if len(component) > 1:
                    loops.append(frozenset(component))
    return loops


def _describe(graph: grimp.ImportGraph, loop: frozenset[str]) -> str:
    edges = [f"  {a} -> {b}" for a in sorted(loop) for b in sorted(graph.find_modules_directly_imported_by(a)) if b in loop]
    return "\n".join([", ".join(sorted(loop)), *edges])


def test_the_loop_finder_finds_direct_and_longer_loops() -> None:
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.a"), ("p.c", "p.d"), ("p.d", "p.e"), ("p.e", "p.c"), ("p.e", "p.f"), ("p.f", "p.g")]:
        graph.add_import(importer=a, imported=b)
    assert sorted(sorted(loop) for loop in import_loops(graph)) == [["p.a", "p.b"], ["p.c", "p.d", "p.e"]]


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("railyard", "railyard_local", "railyard_trainer", exclude_type_checking_imports=True)
    new = [loop for loop in import_loops(graph) if loop not in ALLOWED]
    assert not new, "import circles (move what both sides need into a module of its own):\n" + "\n".join(
        _describe(graph, loop) for loop in new
    )
