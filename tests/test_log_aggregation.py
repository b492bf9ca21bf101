"""The pure aggregation of proc output lines (runtime.logs.aggregation)."""
from __future__ import annotations

from runtime.logs.aggregation import Aggregator, edit_distance, format_ranks, similar


def test_edit_distance_and_similarity():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("same", "same") == 0
    assert edit_distance("aaaa", "bbbbbbbbbb", limit=2) == 3  # stopped early
    assert similar("loss 0.13", "loss 0.12")
    assert similar("step 100 loss 0.1312", "step 100 loss 0.1298")
    assert not similar("loss 0.13", "saving checkpoint")
    assert not similar("x" * 500, "x" * 499 + "y")  # long lines: identical only
    assert similar("x" * 500, "x" * 500)


def test_format_ranks():
    assert format_ranks([3, 0, 1, 2, 7, 9, 10]) == "0-3,7,9-10"
    assert format_ranks([5]) == "5" and format_ranks([]) == ""
    assert format_ranks([1, 1, 2]) == "1-2"


def test_lines_from_many_ranks_print_once_with_count_and_ranks():
    agg = Aggregator()
    opened = [agg.add("trainers", "stdout", r, f"loss 0.1{r % 10}", now=10.0, window=3)
              for r in range(16)]
    assert opened == [True] + [False] * 15
    agg.add("trainers", "stdout", 4, "saving checkpoint", now=10.5, window=3)
    agg.add("trainers", "stderr", 2, "warning: slow", now=10.5, window=3)
    assert agg.due(12.9) == [] and agg.due(13.0) == [("trainers", "stdout")]
    assert sorted(agg.due(13.5)) == [("trainers", "stderr"), ("trainers", "stdout")]
    out = agg.flush(("trainers", "stdout"))
    assert out == [("16 similar log lines", "stdout", "[trainers 0-15] loss 0.10\n"),
                   ("trainers 4", "stdout", "saving checkpoint\n")]
    assert agg.flush(("trainers", "stdout")) == []  # forgotten
    assert agg.keys() == [("trainers", "stderr")] and agg.keys("other") == []
    assert agg.flush(("trainers", "stderr")) == [("trainers 2", "stderr", "warning: slow\n")]
    assert agg.keys() == []


def test_meshes_are_kept_apart_and_windows_restart():
    agg = Aggregator()
    agg.add("a", "stdout", 0, "hello", now=0.0, window=1)
    agg.add("b", "stdout", 0, "hello", now=0.5, window=5)
    assert agg.due(1.0) == [("a", "stdout")]
    assert agg.flush(("a", "stdout")) == [("a 0", "stdout", "hello\n")]
    assert agg.add("a", "stdout", 1, "hello", now=1.2, window=1)  # a new window opens
    assert agg.due(2.0) == [] and agg.due(2.2) == [("a", "stdout")]
    assert agg.flush(("b", "stdout")) == [("b 0", "stdout", "hello\n")]


def test_a_flood_of_distinct_lines_is_bounded():
    agg = Aggregator(max_groups=3)
    for i in range(10):
        agg.add("m", "stdout", i, f"unique line number {i} " + "z" * i * 7, now=0, window=1)
    out = agg.flush(("m", "stdout"))
    assert len(out) == 3 and out[-1][:2] == ("8 similar log lines", "stdout")
    assert out[-1][2].startswith("[m 2-9] ")


def test_tags_and_control_marks_in_the_middle_of_a_line():
    """fd-level output without a final newline, then a tagged Python-level line (a
    notebook cell's end mark): no control sequence survives in what is forwarded or kept."""
    from runtime.logs import CONTROL_MARK, TAG_END, TAG_START, LineSplitter, strip_marks

    mark = f"{CONTROL_MARK}end:abc{TAG_END}"
    sp = LineSplitter("procs")
    got = sp.feed(f"raw{TAG_START}cells{TAG_END}{mark}\nplain\n".encode())
    assert got == [("procs", "raw"), ("cells", mark + "\n"), ("procs", "plain\n")]
    assert strip_marks(f"raw{mark}\nnext\n") == "raw\nnext\n"
    assert strip_marks(f"{mark}\nnext\n") == "next\n"
    assert strip_marks(f"{mark}\nnext\n", line_open=True) == "\nnext\n"
    assert strip_marks("a\n" + mark + "\n") == "a\n"
    assert strip_marks("no marks\n") == "no marks\n"


def test_a_partial_line_flushed_keeps_its_label_for_the_rest_of_it():
    """The agent flushes a partial line after 0.1 s; the rest of that line (often only its
    newline, the second write of a `print`) keeps the label the line started with."""
    from runtime.logs import TAG_END, TAG_START, LineSplitter

    sp = LineSplitter("procs")
    assert sp.feed(f"{TAG_START}loud{TAG_END}loss".encode()) == []
    assert sp.flush() == [("loud", "loss")]
    assert sp.feed(b"\n") == [("loud", "\n")]
    assert sp.feed(b"fd-level\n") == [("procs", "fd-level\n")]  # a new line: no label
    assert sp.feed(f"{TAG_START}a{TAG_END}x{TAG_START}b{TAG_END}y".encode()) == []
    assert sp.flush() == [("a", "x"), ("b", "y")]
    assert sp.flush() == []
    assert sp.feed(b" more") == [] and sp.flush() == [("b", " more")]
    assert sp.feed(b"\nnext\n") == [("b", "\n"), ("procs", "next\n")]


def test_a_terminal_prints_a_late_newline_as_the_end_of_its_line(capsys):
    """Without a sink a partial line prints as a line; the newline that ends it later
    prints nothing (an empty `[mesh rank]` line before), a newline of its own still does."""
    from runtime.logs import emit

    open_lines: set = set()
    emit(None, "loud 0", "stdout", "loss 0.13", open_lines)
    emit(None, "loud 1", "stdout", "other rank\n", open_lines)
    emit(None, "loud 0", "stdout", "\nnext\n", open_lines)
    emit(None, "loud 0", "stdout", "\n", open_lines)  # print(): an empty line of its own
    assert capsys.readouterr().out == ("[loud 0] loss 0.13\n[loud 1] other rank\n"
                                       "[loud 0] next\n[loud 0] \n")
    assert not open_lines
