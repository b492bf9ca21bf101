"""Actor classes for the Monarch-compatibility tests (imported by the workers by reference)."""
from __future__ import annotations

import logging

from runtime import Actor, context, current_actor_name, current_rank, current_size, endpoint


class Whoami(Actor):
    """Reports what Monarch's context API says inside an actor."""

    @endpoint
    def info(self) -> dict:
        ins = context().actor_instance
        return {"rank": ins.rank.rank, "coords": dict(ins.rank), "str": str(ins.rank),
                "actor_id": ins.actor_id, "name": ins.name, "class_name": ins.class_name,
                "creator": repr(ins.creator) if ins.creator is not None else None,
                "message_rank": dict(context().message_rank),
                "message_flat": context().message_rank.rank,
                "current_actor_name": current_actor_name(), "qualified": str(ins)}

    @endpoint
    async def ainfo(self) -> dict:
        return {"message_rank": dict(context().message_rank),
                "rank": context().actor_instance.rank.rank,
                "current_rank": dict(current_rank()), "current_flat": current_rank().rank,
                "current_size": current_size()}

    @endpoint
    def log(self, msg: str, level: int = logging.INFO) -> dict:
        seen: list = []

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                seen.append({"actor_name": record.actor_name, "rank": record.rank,
                             "point": record.point, "msg": record.getMessage()})

        h = Keep()
        self.logger.addHandler(h)
        try:
            self.logger.log(level, msg)
        finally:
            self.logger.removeHandler(h)
        return {"records": seen, "is_logger": isinstance(self.logger, logging.Logger),
                "logger_name": self.logger.name}


class Parent(Actor):
    """Spawns children from inside an actor (to check `creator`)."""

    @endpoint
    def children_info(self) -> list:
        from runtime import this_host

        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            kids = procs.spawn("kids", Whoami)
            return list(kids.info.call().get(timeout=60).values())
        finally:
            procs.stop().get(timeout=30)


class Printer(Actor):
    """Prints and logs from every rank (for logging_option)."""

    @endpoint
    def say(self, text: str) -> None:
        print(text, flush=True)

    @endpoint
    def say_slowly(self, text: str, pause: float) -> None:
        """`print(text)` as a loaded machine may run it: the newline comes `pause` s after
        the text (past the agent's 0.1 s flush of a partial line)."""
        import sys
        import time

        sys.stdout.write(text)
        time.sleep(pause)
        sys.stdout.write("\n")

    @endpoint
    def debug(self, text: str) -> None:
        self.logger.debug(text)
