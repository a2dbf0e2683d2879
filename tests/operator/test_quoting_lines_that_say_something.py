"""The last words a failure's condition and Event quote are lines that say something: not a
torch UserWarning (issue 46: a NodeNotReady Event quoted one), but the error, the traceback's
end, or the trainer's own events."""

from __future__ import annotations

import pytest

from railyard.api.trainingjob import LastFailure
from railyard.logic.failure_report import (
    describe_failure,
    pick_lines_that_say_something,
    quote_last_words,
)
from railyard.logic.failures import Failure
from railyard.protocol.exitcodes import FailureClass

WARNING = (
    "/usr/local/lib/python3.11/site-packages/torch/distributed/fsdp/_init_utils.py:440: UserWarning: "
    "FSDP is switching to use `NO_SHARD` instead of ShardingStrategy.FULL_SHARD since the world size is 1.\n"
    "  warnings.warn(\n"
)
EVENT = '{"event":"step","time":1765080000.1,"step":41,"loss":2.31}'
TRACEBACK_END = (
    "Traceback (most recent call last):\n"
    '  File "/app/train.py", line 12, in <module>\n'
    "    all_reduce(t)\n"
    "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3\n"
)

ROWS = [
    ("a warning after the trainer's events", EVENT + "\n" + WARNING, [EVENT]),
    ("warnings between events", EVENT + "\n" + WARNING + EVENT.replace("41", "42") + "\n" + WARNING,
     [EVENT, EVENT.replace("41", "42")]),
    ("a FutureWarning too", "started\n" + WARNING.replace("UserWarning", "FutureWarning"), ["started"]),
    ("the traceback's end, not the launcher's lines after it",
     TRACEBACK_END + '{"event":"worker_exit","rank":3,"code":1}\n' + WARNING,
     ['Traceback (most recent call last):', 'File "/app/train.py", line 12, in <module>', "all_reduce(t)",
      "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3"]),
    ("a log line at ERROR", "INFO ready\nERROR lost the store at 10.0.0.3\nINFO retrying\n",
     ["INFO ready", "ERROR lost the store at 10.0.0.3"]),
    ("only warnings: they are all there is", WARNING, [WARNING.splitlines()[0], "warnings.warn("]),
    ("nothing", "", []),
]


@pytest.mark.parametrize(("what", "message", "kept"), ROWS, ids=[r[0] for r in ROWS])
def test_the_lines_that_say_something(what: str, message: str, kept: list[str]) -> None:
    assert pick_lines_that_say_something(message) == kept, what


def test_a_node_not_ready_event_quotes_the_trainer_not_a_warning() -> None:
    failure = Failure("NodeNotReady", FailureClass.INFRASTRUCTURE, ("n3",), "node n3 is NotReady", pod="llm-0-3")
    report = LastFailure(attempt=0, reason="NodeNotReady", pod="llm-0-3", node="n3", message=EVENT + "\n" + WARNING)
    text = describe_failure(failure, report)
    assert "UserWarning" not in text and "warnings.warn" not in text
    assert text.endswith(f': "{EVENT}"')
    assert quote_last_words(TRACEBACK_END + '{"event":"worker_exit"}\n').endswith("aborted on rank 3")
