"""Print the transcript of a real notebook debugging session (a kernel driven through
jupyter_client, typed answers at its stdin prompts):
`PYTHONPATH=. python tests/kernel_debug/demo_transcript.py`."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernel_debug.driver import INTERRUPT, KernelSession  # noqa: E402

CELLS = [
    ('''from runtime import Actor, endpoint, this_host, current_rank

class Trainer(Actor):
    def __init__(self):
        self.loss = 10.0

    @endpoint
    def step(self, lr):
        grad = self.loss * 0.5 + current_rank().rank
        breakpoint()
        self.loss -= lr * grad
        return round(self.loss, 3)

trainers = this_host().spawn_procs(per_host={"procs": 2}).spawn("trainers", Trainer)''', []),
    ("trainers.step.call(0.1).get()",
     ["p grad", "n", "p self.loss", "ll", "%list", "%cast ranks(procs=0:2) p grad", "c",
      "w", INTERRUPT]),
]


def main() -> None:
    k = KernelSession()
    try:
        for i, (code, answers) in enumerate(CELLS, 1):
            r = k.run(code, answers)
            print(f"In [{i}]: " + code.replace("\n", "\n        "))
            print(r.transcript)
    finally:
        k.close()


if __name__ == "__main__":
    main()
