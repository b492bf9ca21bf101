"""The %mesh / %%mesh argument parsers: every command, --help, and one-line errors."""

import pytest

from monarch_kernel.args import (
    ActivateArgs, AdminArgs, AttachArgs, DeactivateArgs, AllocArgs, JobAllocArgs, CellArgs, InterruptArgs, KillArgs, ListArgs, LogsArgs, MagicArgError, MagicHelp, SpawnArgs, StacksArgs, TimelineArgs,
    StatusArgs, StopArgs, parse_mesh_cell, parse_mesh_line, parse_ranks, parse_sizes,
)


def test_alloc_defaults_and_options():
    assert parse_mesh_line("alloc trainers") == AllocArgs(name="trainers", per_host={"procs": 1})
    a = parse_mesh_line("alloc t --per-host hosts=1,procs=4 --env A=1 --env B=x=y "
                        "--mesh-name tr --no-progress --timeout 30 --hosts job")
    assert a == AllocArgs(name="t", per_host={"hosts": 1, "procs": 4}, hosts="job",
                          mesh_name="tr", env={"A": "1", "B": "x=y"}, progress=False,
                          timeout=30.0)
    # several after one --env, as docs/kernel.md writes it
    assert parse_mesh_line("alloc t --env A=1 B=2 --no-progress").env == {"A": "1", "B": "2"}


def test_alloc_on_a_job_passes_the_job_arguments_through():
    a = parse_mesh_line("alloc t --job slurm --hosts 2 --per-host procs=8 --partition gpu "
                        "--no-progress")
    assert a == JobAllocArgs(name="t", argv=["t", "--job", "slurm", "--hosts", "2",
                                             "--per-host", "procs=8", "--partition", "gpu"],
                             progress=False)
    with pytest.raises(MagicArgError, match="for N hosts of a new job add --job KIND"):
        parse_mesh_line("alloc t --hosts 2")
    with pytest.raises(MagicArgError, match="NAME must come first"):
        parse_mesh_line("alloc --job local t")
    with pytest.raises(MagicHelp, match="On a new multi-host job instead"):
        parse_mesh_line("alloc t --job local --help")


def test_spawn_args_and_kwargs_anywhere():
    s = parse_mesh_line("spawn t Counter 0 --as c 'name=\"a b\"' --name counters")
    assert s == SpawnArgs(mesh="t", actor_class="Counter", name="counters", var="c",
                          args=["0"], kwargs={"name": '"a b"'})
    s = parse_mesh_line("spawn t mod.Cls -- -1 x==2")
    assert s.args == ["-1", "x==2"] and s.kwargs == {}


def test_simple_commands():
    assert parse_mesh_line("list") == ListArgs()
    assert parse_mesh_line("status") == StatusArgs(None)
    assert parse_mesh_line("status trainers") == StatusArgs("trainers")
    assert parse_mesh_line("status --text") == StatusArgs(None, True)
    assert parse_mesh_line("attach trainers 3") == AttachArgs("trainers", 3)
    assert parse_mesh_line("admin") == AdminArgs()
    assert parse_mesh_line("stop a b") == StopArgs(["a", "b"], False)
    assert parse_mesh_line("stop --all") == StopArgs([], True)
    assert parse_mesh_line("kill a b") == KillArgs(["a", "b"])
    with pytest.raises(MagicArgError, match="NAME"):
        parse_mesh_line("kill")
    assert parse_mesh_line("interrupt") == InterruptArgs(None)
    assert parse_mesh_line("interrupt local") == InterruptArgs("local")
    assert parse_mesh_line("activate trainers") == ActivateArgs("trainers")
    assert parse_mesh_line("deactivate") == DeactivateArgs()
    assert parse_mesh_line("logs trainers") == LogsArgs("trainers")
    assert parse_mesh_line("logs trainers --rank 1 --tail 20 --grep 'loss [0-9]' --job j") == \
        LogsArgs("trainers", rank=1, tail=20, grep="loss [0-9]", job="j")
    assert parse_mesh_line("logs t --hosts h").hosts == "h"
    assert parse_mesh_line("logs t --all").all and not parse_mesh_line("logs t").all
    assert parse_mesh_line("timeline") == TimelineArgs()
    assert parse_mesh_line("timeline t --last 30 --save t.json --text") == \
        TimelineArgs("t", last=30.0, save="t.json", text=True)
    assert parse_mesh_line("stacks t") == StacksArgs("t")
    assert parse_mesh_line("stacks t --rank 2 --native --timeout 3") == \
        StacksArgs("t", rank=2, native=True, timeout=3.0)
    with pytest.raises(MagicArgError, match="not a valid Python identifier"):
        parse_mesh_line("activate 3x")
    with pytest.raises(MagicArgError, match="activate"):
        parse_mesh_line("activate")


def test_cell_args():
    assert parse_mesh_cell("t") == CellArgs(mesh="t")
    c = parse_mesh_cell("t --ranks procs=0:2 --noblock -o fut")
    assert c.ranks == {"procs": slice(0, 2)} and c.noblock and c.out == "fut"
    assert parse_mesh_cell("t --ranks procs=3 -q").ranks == {"procs": 3}


@pytest.mark.parametrize("line", ["--help", "-h", "help", "alloc --help", "spawn --help",
                                  "list --help", "status -h", "stop --help",
                                  "interrupt --help", "attach --help", "admin --help",
                                  "logs --help", "timeline --help", "stacks --help"])
def test_every_line_command_has_help(line):
    with pytest.raises(MagicHelp) as e:
        parse_mesh_line(line)
    assert "usage:" in e.value.text


def test_cell_help():
    with pytest.raises(MagicHelp) as e:
        parse_mesh_cell("--help")
    assert "usage: %%mesh" in e.value.text and "--ranks" in e.value.text


@pytest.mark.parametrize("line,needle", [
    ("", "missing COMMAND"),
    ("bogus", "unknown command 'bogus'"),
    ("alloc", "required: NAME"),
    ("alloc 1x", "not a valid Python identifier"),
    ("alloc t --per-host procs", "expected DIM=SIZE"),
    ("alloc t --per-host procs=0", "at least 1"),
    ("alloc t --per-host procs=two", "must be an integer"),
    ("alloc t --per-host procs=1,procs=2", "given twice"),
    ("alloc t --env NOEQUALS", "KEY=VALUE"),
    ("alloc t --timeout 0", "must be positive"),
    ("alloc t --frobnicate", "unrecognized arguments: --frobnicate"),
    ("spawn t", "required: ActorClass"),
    ("spawn t C 1+", "not a Python expression"),
    ("spawn t C k=1 2", "follows keyword"),
    ("spawn t C k=1 k=2", "given twice"),
    ("stop", "give a mesh name"),
    ("stop a --all", "not both"),
    ("interrupt sometimes", "invalid choice"),
    ("attach trainers one", "invalid int value"),
    ("attach trainers", "required: RANK"),
    ("alloc t --per-host 'procs=1", "cannot split"),
    ("logs", "required: MESH"),
    ("logs t --tail -1", "integer >= 0"),
    ("logs t --job a --hosts b", "not allowed with"),
    ("logs t --tail 3 --all", "not allowed with"),
    ("timeline t --last 0", "must be positive"),
    ("stacks", "required: MESH"),
    ("stacks t --rank -1", "integer >= 0"),
])
def test_line_errors_are_one_line(line, needle):
    with pytest.raises(MagicArgError) as e:
        parse_mesh_line(line)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert msg.startswith("%mesh")


@pytest.mark.parametrize("line,needle", [
    ("", "missing MESH"),
    ("t --ranks procs", "expected DIM=INDEX"),
    ("t --ranks procs=a", "expected an integer"),
    ("t --ranks procs=::0", "cannot be zero"),
    ("t --ranks procs=1:2:3:4", "at most START:STOP:STEP"),
    ("t extra", "unrecognized arguments: extra"),
    ("t --noblock --timeout 3", "--noblock"),
    ("t -o 9", "not a valid Python identifier"),
])
def test_cell_errors_are_one_line(line, needle):
    with pytest.raises(MagicArgError) as e:
        parse_mesh_cell(line)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg
    assert msg.startswith("%%mesh")


def test_value_parsers():
    assert parse_sizes("hosts=2, gpus=8") == {"hosts": 2, "gpus": 8}
    assert list(parse_sizes("b=1,a=2")) == ["b", "a"]  # order is the mesh's dimension order
    assert parse_ranks("hosts=1,procs=::2") == {"hosts": 1, "procs": slice(None, None, 2)}
    assert parse_ranks("procs=-1") == {"procs": -1}
    with pytest.raises(MagicArgError):
        parse_ranks("")


def test_sync_and_reload_commands():
    from monarch_kernel.args import MagicArgError, ReloadArgs, SyncArgs, parse_mesh_line

    assert parse_mesh_line("sync") == SyncArgs()
    cwd = __import__("os").getcwd()
    assert parse_mesh_line("sync procs --dir a --dir b --reload --timeout 5") == SyncArgs(
        mesh="procs", dirs=["a", "b"], reload=True, timeout=5.0,
        names={f"{cwd}/a": "a", f"{cwd}/b": "b"})
    assert parse_mesh_line("reload g") == ReloadArgs(actors="g")
    import os

    here = os.getcwd()
    a = parse_mesh_line("sync --dir /x/src --dir lib=/y/src")
    assert a.names == {"/x/src": "src", "/y/src": "lib"}
    with pytest.raises(MagicArgError, match=r"--dir /x/src and --dir /y/src would both land "
                                            r"on 'src' on the hosts; name one: "
                                            r"--dir OTHER_NAME=/y/src"):
        parse_mesh_line("sync --dir /x/src --dir /y/src")
    assert parse_mesh_line("sync --dir a").names == {os.path.join(here, "a"): "a"}
    assert parse_mesh_line("reload g --class mod.Greeter") == ReloadArgs("g", "mod.Greeter")
    with pytest.raises(MagicArgError):
        parse_mesh_line("reload")
    with pytest.raises(MagicArgError):
        parse_mesh_line("sync 1bad")


def test_chaos_line_durations_and_errors():
    from monarch_kernel import args as a

    assert a.parse_mesh_line("chaos p --kill-every 500ms --for 2m") == a.ChaosArgs(
        mesh="p", kill_every=0.5, duration=120.0)
    assert a.parse_mesh_line("chaos p --stop") == a.ChaosArgs(mesh="p", stop=True)
    for bad, msg in (("chaos p", "--kill-every"), ("chaos p --kill-every soon", "duration"),
                     ("chaos p --kill-every 0s", "positive"),
                     ("chaos p --stop --for 1s", "--stop takes no")):
        with pytest.raises(a.MagicArgError, match=msg):
            a.parse_mesh_line(bad)


def test_chaos_raise_mode_and_its_errors():
    from monarch_kernel import args as a

    assert a.parse_mesh_line("chaos p --raise --every 500ms --for 2m") == a.ChaosArgs(
        mesh="p", raise_every=0.5, duration=120.0)
    assert a.parse_mesh_line("chaos p --every 2s") == a.ChaosArgs(mesh="p", kill_every=2.0)
    for bad, msg in (("chaos p --raise", "--raise raises with --every"),
                     ("chaos p --raise --kill-every 1s", "--raise and --kill-every exclude"),
                     ("chaos p --raise --every 1s --kill-every 1s", "exclude each other"),
                     ("chaos p --kill-every 1s --every 1s", "interval once"),
                     ("chaos p --raise --every never", "duration"),
                     ("chaos p --raise --every 0s", "positive"),
                     ("chaos p --stop --raise", "--stop takes no"),
                     ("chaos p --stop --every 1s", "--stop takes no")):
        with pytest.raises(a.MagicArgError, match=msg):
            a.parse_mesh_line(bad)
