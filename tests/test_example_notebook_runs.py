"""``examples/explore.ipynb`` runs top to bottom (nbclient, a fresh kernel on this interpreter; no Ray),
and the outputs committed with it are the ones it produces now. To refresh them after changing the
notebook or the code it calls: ``python tests/test_example_notebook_runs.py`` (executes it in place)."""

import sys

import pytest

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # run as a script too (repo.py is beside this file)
from repo import REPO  # noqa: E402

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOK = REPO / "examples" / "explore.ipynb"

pytestmark = pytest.mark.timeout(300)


def _text_outputs(nb) -> list:
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o.get("text", ""))
            elif o.get("output_type") == "execute_result":
                out.append(o.get("data", {}).get("text/plain", ""))
    return out


def execute(nb) -> None:
    nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(REPO / "examples")}}).execute()


def test_notebook_executes_without_errors_and_matches_its_committed_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    committed = _text_outputs(nb)
    execute(nb)  # raises CellExecutionError naming the cell on any exception
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    produced = _text_outputs(nb)
    assert produced, "the notebook showed no result"
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if "image/png" in o.get("data", {})]
    assert images, "the notebook drew no figure"
    assert committed == produced, ("examples/explore.ipynb's committed outputs are stale: "
                                   "python tests/test_example_notebook_runs.py")


if __name__ == "__main__":
    book = nbformat.read(NOTEBOOK, as_version=4)
    execute(book)
    nbformat.write(book, NOTEBOOK)
    print(f"executed {NOTEBOOK} in place")
