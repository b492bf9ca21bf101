"""logging_option in a notebook cell: aggregated lines land in the cell that caused them."""
from __future__ import annotations


import pytest

from test_kernel_client import kernel_session

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def kernel():
    with kernel_session() as k:
        yield k


def test_aggregated_lines_print_in_the_cell(kernel):
    r = kernel.execute("%mesh alloc workers --per-host procs=4")
    assert r["error"] is None, r["error"]
    kernel.track_processes()
    r = kernel.execute(
        "from runtime import Actor, endpoint\n"
        "class Loud(Actor):\n"
        "    @endpoint\n"
        "    def say(self, text):\n"
        "        print(text, flush=True)\n"
        "workers.logging_option(stream_to_client=True, aggregate_window_sec=30)\n"
        "loud = workers.spawn('loud', Loud)\n"
        "loud.say.call('loss 0.13').get()\n")
    assert r["error"] is None, r["error"]
    assert r["stdout"].splitlines() == ["[4 similar log lines] [loud 0-3] loss 0.13"], r
    r = kernel.execute("loud.say.call('next cell').get()")
    assert r["stdout"].splitlines() == ["[4 similar log lines] [loud 0-3] next cell"], r
