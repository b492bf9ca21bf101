"""notebooks/parameter_server.ipynb runs headless and its own checks pass."""

from __future__ import annotations

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "parameter_server.ipynb")


@pytest.mark.timeout(240)
def test_parameter_server_notebook_executes():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": os.path.dirname(NOTEBOOK)}})
    client.execute()  # raises CellExecutionError if any cell (or its asserts) fails
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)
    assert "workers and controller see the server's weights" in text
    assert "via vm" in text  # same host: the process_vm path
