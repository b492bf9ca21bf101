"""Monarch's context API through `runtime`: context().actor_instance, message_rank,
current_actor_name(), Actor.logger, str(point)."""
from __future__ import annotations

import logging
import threading

import pytest

import runtime
from runtime import Point, Shape, context, current_actor_name, this_host

from _monarch_context_actors import Parent, Whoami
from _procs import spawn_procs_fixture

pytestmark = pytest.mark.timeout(120)


procs = spawn_procs_fixture({"hosts": 2, "gpus": 2})


@pytest.fixture(scope="module")
def who(procs):
    return procs.spawn("who", Whoami)


def test_extent_is_a_dict_with_monarchs_attributes(procs):
    ext = procs.extent
    assert isinstance(ext, runtime.Extent) and ext == {"hosts": 2, "gpus": 2}
    assert ext.labels == ["hosts", "gpus"] and ext.sizes == [2, 2] and ext.nelements == 4
    p = Point(3, Shape(("hosts", "gpus"), (2, 2)))
    assert p.extent.sizes == [2, 2] and dict(p.extent) == {"hosts": 2, "gpus": 2}
    assert runtime.Extent(["a"], [3]) == {"a": 3} and runtime.Extent({"a": 3}).labels == ["a"]
    with pytest.raises(runtime.ShapeError, match="labels"):
        runtime.Extent(["a", "b"], [1])


def test_point_prints_in_monarchs_form():
    shape = Shape(("hosts", "gpus"), (1, 2))
    assert str(Point(1, shape)) == "{'hosts': 0/1, 'gpus': 1/2}"
    assert str(Point(0, Shape((), ()))) == "{}"
    assert repr(Point(1, shape)) == "Point(rank=1, hosts=0, gpus=1)"  # repr unchanged


def test_actor_instance_inside_an_actor(who):
    infos = sorted(who.info.call().get(timeout=60).values(), key=lambda d: d["rank"])
    assert [d["rank"] for d in infos] == [0, 1, 2, 3]
    d = infos[3]
    assert d["coords"] == {"hosts": 1, "gpus": 1} and d["str"] == "{'hosts': 1/2, 'gpus': 1/2}"
    assert d["name"] == "who" and d["class_name"] == "Whoami" and d["creator"] == "<root>"
    # one name per actor (Monarch's tests tell ranks apart by it): the mesh id and rank
    assert d["current_actor_name"] == f"{d['actor_id']}[3]" and d["actor_id"]
    assert len({i["current_actor_name"] for i in infos}) == 4
    # Monarch's actor names: the root client, then `<module.Class mesh{point}>`
    assert d["qualified"] == \
        "<root>.<_monarch_context_actors.Whoami who{'hosts': 1/2, 'gpus': 1/2}>"
    # the whole mesh was called: the message rank is the actor's own rank
    assert d["message_rank"] == {"hosts": 1, "gpus": 1} and d["message_flat"] == 3


def test_message_rank_is_the_point_in_the_slice_called(who):
    sl = who.slice(gpus=1)  # ranks 1 and 3 of the mesh
    got = sorted(sl.info.call().get(timeout=60).values(), key=lambda d: d["rank"])
    assert [d["rank"] for d in got] == [1, 3]
    assert [d["message_rank"] for d in got] == [{"hosts": 0}, {"hosts": 1}]
    assert [d["message_flat"] for d in got] == [0, 1]
    one = who.slice(hosts=1, gpus=0).info.call_one().get(timeout=60)
    assert one["rank"] == 2 and one["message_rank"] == {} and one["message_flat"] == 0
    a = who.slice(hosts=1).ainfo.call().get(timeout=60)  # async endpoints see it too
    assert sorted((v["rank"], tuple(v["message_rank"].items())) for v in a.values()) == [
        (2, (("gpus", 0),)), (3, (("gpus", 1),))]
    # current_rank()/current_size() are Monarch's: the point in (and sizes of) the slice
    assert sorted((v["rank"], v["current_flat"], tuple(v["current_rank"].items()))
                  for v in a.values()) == [(2, 0, (("gpus", 0),)), (3, 1, (("gpus", 1),))]
    assert [v["current_size"] for v in a.values()] == [{"gpus": 2}, {"gpus": 2}]
    whole = sorted(who.ainfo.call().get(timeout=60).values(), key=lambda d: d["rank"])
    assert [d["current_flat"] for d in whole] == [0, 1, 2, 3]  # whole mesh: own rank
    assert whole[3]["current_rank"] == {"hosts": 1, "gpus": 1}
    assert whole[3]["current_size"] == {"hosts": 2, "gpus": 2}
    # and the next message to the whole mesh is back to the actor's own rank
    again = who.slice(hosts=1, gpus=1).info.call_one().get(timeout=60)
    assert again["message_rank"] == {} and who.info.call().get(timeout=60)


def test_context_in_the_controller():
    ctx = context()
    assert ctx.actor_instance is ctx and ctx.actor_id == "controller"
    assert current_actor_name() == "controller"
    assert len(ctx.message_rank) == 0 and ctx.message_rank.rank == 0
    assert ctx.name == "controller" and ctx.creator is None


def test_creator_is_the_spawning_actor():
    with this_host().spawn_procs(per_host={"procs": 1}) as pm:
        parent = pm.spawn("parent", Parent)
        kids = parent.children_info.call_one().get(timeout=90)
    parent = "<root>.<_monarch_context_actors.Parent parent{'procs': 0/1}>"
    assert kids[0]["creator"] == parent
    assert kids[0]["qualified"] == parent + ".<_monarch_context_actors.Whoami kids{'procs': 0/1}>"


def test_actor_logger_records_carry_name_and_rank_and_reach_the_controller(who):
    got: list = []
    done, marked = threading.Event(), threading.Event()
    rt = runtime.get_runtime()

    def sink(label, stream, text):
        got.append((label, stream, text))
        if "hello from the logger" in text:
            done.set()
        if "sync mark" in text:
            marked.set()

    rt.set_output_sink(sink)
    try:
        r = who.slice(hosts=1, gpus=0).log.call_one("hello from the logger").get(timeout=60)
        assert done.wait(10)
        # DEBUG is recorded (Monarch's logger level) but not printed by default
        who.slice(hosts=1, gpus=0).log.call_one("quiet debug", logging.DEBUG).get(timeout=60)
        who.slice(hosts=1, gpus=0).log.call_one("sync mark").get(timeout=60)
        assert marked.wait(10)  # output of one actor arrives in order: the debug line is not coming
    finally:
        rt.set_output_sink(None)
    assert r["is_logger"] and r["logger_name"] == "Whoami"
    assert r["records"] == [{"actor_name": "who", "rank": 2, "point": "{'hosts': 1/2, 'gpus': 0/2}",
                             "msg": "[actor=<root>.<_monarch_context_actors.Whoami who{'hosts': "
                                    "1/2, 'gpus': 0/2}>] hello from the logger"}]
    line = [(lbl, s, t) for lbl, s, t in got if "hello from the logger" in t][0]
    assert line[0] == "who 2" and line[1] == "stderr"
    assert "INFO Whoami: [actor=<root>.<_monarch_context_actors.Whoami who" in line[2]
    assert not any("quiet debug" in t for _, _, t in got)


def test_context_alias_and_enable_transport():
    assert runtime.Context is runtime.ActorContext and isinstance(context(), runtime.Context)
    for name in ("tcp", "ipc", "tcp://127.0.0.1:0"):
        assert runtime.enable_transport(name) is None
    with pytest.raises(ValueError, match="unknown transport"):
        runtime.enable_transport("carrier-pigeon")
    with pytest.raises(TypeError, match="transport name"):
        runtime.enable_transport(3)
