"""The Spark sink's checks that need no Spark: configuration and the speculation refusal."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from resolvers import LoadBalancer
from smartclient import ConfigurationError
from smartclient.spark import ExactlyOnceSink, StreamConnection

CONN = StreamConnection("rabbitmq-stream://u:secret@lb:5552/", resolver=LoadBalancer("lb:5552"))


def test_connection_crosses_to_executors_and_hides_the_password() -> None:
    copy = pickle.loads(pickle.dumps(CONN))
    assert copy == CONN and "secret" not in repr(copy)
    sink = ExactlyOnceSink(CONN, app_id="a", stream="s", key_columns=["k"], order_columns=["o"])
    assert pickle.loads(pickle.dumps(sink)) == sink
    with pytest.raises(ConfigurationError, match="unsupported URI scheme"):
        StreamConnection("amqp://lb")


@pytest.mark.parametrize("kwargs, message", [
    ({"stream": "s", "super_stream": "t"}, "either stream= or super_stream="),
    ({}, "either stream= or super_stream="),
    ({"stream": "s", "app_id": ""}, "app_id must be a non-empty str"),
    ({"stream": "s", "key_columns": []}, "key_columns and order_columns"),
    ({"stream": "s", "slots": 0}, "slots must be an int from 1 to 200"),
    ({"stream": "s", "partitioning": "hash"}, "partitioning must be one of 'slots', 'input', not 'hash'"),
    ({"stream": "s", "partitioning": "input"}, "order_columns and slots belong to partitioning='slots'"),
    ({"stream": "s", "partitioning": "input", "order_columns": [], "slots": 3}, "order_columns and slots belong"),
    ({"stream": "s", "partitioning": "input", "order_columns": []}, "takes no key_columns"),
    ({"super_stream": "t", "partitioning": "input", "order_columns": [], "key_columns": []}, "needs key_columns"),
    ({"stream": "s", "sub_entry_size": 0}, "sub_entry_size must be an int from 1 to 65535"),
    ({"stream": "s", "sub_entry_size": True}, "sub_entry_size must be an int from 1 to 65535"),
    ({"stream": "s", "compression": "zstd"}, "compression must be one of 'none', 'gzip', not 'zstd'"),
    ({"stream": "s", "compression": "gzip", "sub_entry_size": 1}, "compresses sub-entries: give sub_entry_size above"),
])
def test_bad_sink_configuration(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"app_id": "a", "key_columns": ["k"], "order_columns": ["o"], **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        ExactlyOnceSink(CONN, **base)  # type: ignore[arg-type]


def test_speculation_is_refused() -> None:
    conf = SimpleNamespace(get=lambda key, default=None: "true" if key == "spark.speculation" else default)
    df = SimpleNamespace(sparkSession=SimpleNamespace(conf=conf))
    sink = ExactlyOnceSink(CONN, app_id="a", stream="s", key_columns=["k"], order_columns=["o"])
    with pytest.raises(ConfigurationError, match=r"spark\.speculation is on"):
        sink(df, 0)


def test_the_input_mode_needs_no_order_and_no_slots() -> None:
    sink = ExactlyOnceSink(CONN, app_id="a", stream="s", partitioning="input")
    assert pickle.loads(pickle.dumps(sink)) == sink
    assert sink._targets() == ["s"]
    assert ExactlyOnceSink(CONN, app_id="a", stream="s", key_columns=["k"], order_columns=["o"])._targets() == ["s"] * 4


def sub_entries_sent(rows: list[bytes], cuts: list[int], size: int) -> list[tuple[int, list[bytes]]]:
    """What one task's writer sends for ``rows`` (Arrow batches cut at ``cuts``): (position id, rows) each."""
    import asyncio

    from smartclient.spark.sink import _TaskWriter

    sent: list[tuple[int, list[bytes]]] = []

    class Producer:
        async def send_sub_entry(self, group: list[bytes], *, publishing_id: int, compression: str = "none") -> None:
            assert publishing_id >> 32 == 5
            sent.append((publishing_id & 0xFFFFFFFF, list(group)))

        async def send_many(self, bodies: list[bytes], *, first_publishing_id: int) -> None:  # one entry per row
            for index, body in enumerate(bodies):
                await self.send_sub_entry([body], publishing_id=first_publishing_id + index)

        async def flush(self) -> None: ...
        async def close(self) -> None: ...

    async def env_producer(stream: str, name: str) -> Producer:
        return Producer()

    writer = _TaskWriter(batch_id=5, sub_entry_size=size)
    env = SimpleNamespace(producer=env_producer)
    start = 0
    for end in [*cuts, len(rows)]:
        asyncio.run(writer.publish_runs(env, [("s", "app-0", rows[start:end])]))
        start = end
    asyncio.run(writer.finish(env))
    assert writer.written == len(rows)
    return sent


def test_sub_entries_group_rows_by_their_position_whatever_the_arrow_batches() -> None:
    """A producer's rows go in groups by position in its sequence, each group's publishing id its last row's
    position: batches cut anywhere give the same groups, so a replay sends the same ones."""
    rows = [b"%d" % i for i in range(10)]

    def groups(cuts: list[int]) -> list[tuple[int, list[bytes]]]:
        return sub_entries_sent(rows, cuts, 4)

    expected = [(3, rows[0:4]), (7, rows[4:8]), (9, rows[8:10])]
    assert groups([]) == groups([3]) == groups([1, 2, 7]) == groups([4, 8]) == expected


def test_a_group_closes_before_the_row_that_would_take_it_over_the_byte_bound() -> None:
    from smartclient.spark.sink import SUB_ENTRY_BYTES, closed_groups

    third = SUB_ENTRY_BYTES // 3
    assert closed_groups([third] * 7, 100) == [3, 6]  # the 4th row would go over: a group of 3, then 3 more
    assert closed_groups([2 * SUB_ENTRY_BYTES, 1, 1], 100) == [1]  # a row over the bound alone, then more
    assert closed_groups([1] * 9, 4) == [4, 8]
    rows = [bytes(third)] * 5
    assert [len(group) for _, group in sub_entries_sent(rows, [2], 100)] == [3, 2]


@pytest.mark.parametrize(("before", "after"), [(1, 100), (100, 1), (7, 4), (4, 7), (100, 100)])
def test_a_replay_with_other_groups_loses_no_row(before: int, after: int) -> None:
    """Ids are each group's last row's position, so however the grouping changes between a failure and the
    replay (an upgrade that changed the default), the broker's deduplication drops no row that was not
    stored: at most the rows of the group across the cut come twice, and with the same grouping none."""
    rows = [b"%d" % i for i in range(230)]
    for cut in range(0, 231, 23):  # the first run's entries stored before it failed: those ending before the cut
        stored, last = [], -1
        for publishing_id, group in sub_entries_sent(rows, [], before):
            if publishing_id >= cut:
                break
            stored += group
            last = publishing_id
        replayed = [group for publishing_id, group in sub_entries_sent(rows, [50], after) if publishing_id > last]
        everything = stored + [row for group in replayed for row in group]
        assert sorted(set(everything), key=int) == rows  # nothing lost
        extra = len(everything) - len(rows)
        assert extra < max(before, after)
        if before == after:
            assert extra == 0


def test_a_failed_task_sends_no_short_sub_entry_so_its_retry_writes_each_row_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A task that fails after some full groups sends those, but not the rows of its unfinished group: its retry
    sends them in a whole group, under an id above a short group's, so a short group already stored would have
    had its rows stored twice."""
    import asyncio

    import pyarrow as pa

    from smartclient.spark import sink as sink_module

    sent: list[tuple[int, list[bytes]]] = []

    class Producer:
        encoding = "amqp"

        async def send_sub_entry(self, rows: list[bytes], *, publishing_id: int, compression: str = "none") -> None:
            sent.append((publishing_id, rows))

        async def flush(self) -> None: ...
        async def close(self) -> None: ...

    async def env_producer(stream: str, name: str) -> Producer:
        return Producer()

    env = SimpleNamespace(producer=env_producer)
    monkeypatch.setattr(sink_module, "run_with_environment", lambda connection, work: asyncio.run(work(env)))

    def to_message(row: dict[str, object]) -> bytes:
        if row["id"] == 30:
            raise RuntimeError("the application's")
        return b"%d" % row["id"]  # type: ignore[str-bytes-safe]

    sink = ExactlyOnceSink(CONN, app_id="a", stream="s", partitioning="input", sub_entry_size=10,
                           to_message=to_message)
    batches = [pa.RecordBatch.from_pydict({"id": list(range(start, start + 25))}) for start in (0, 25)]
    with pytest.raises(RuntimeError, match="the application's"):
        sink._write_partition(iter(batches), 0, ["s"], partition=3)
    assert [(pid, len(rows)) for pid, rows in sent] == [(9, 10), (19, 10)]  # rows 20-24 wait for the retry
    sent.clear()
    batches = [pa.RecordBatch.from_pydict({"body": [b"%d" % i for i in range(start, start + 25)]}) for start in (0, 25)]
    sink = ExactlyOnceSink(CONN, app_id="a", stream="s", partitioning="input", sub_entry_size=10)
    assert sink._write_partition(iter(batches), 0, ["s"], partition=3) == 50  # the whole task: the last group too
    assert [(pid, len(rows)) for pid, rows in sent] == [(9, 10), (19, 10), (29, 10), (39, 10), (49, 10)]


def test_a_group_over_the_brokers_frame_max_goes_as_halves_each_under_its_last_rows_position() -> None:
    """A broker that negotiates a frame max under the default: a group that does not fit is split in two, and
    again, each part's id its own last row's position (still increasing, still a function of the rows)."""
    import asyncio

    from smartclient import MessageTooLarge
    from smartclient.spark.sink import _TaskWriter

    sent: list[tuple[int, int]] = []

    class SmallFrames:
        async def send_sub_entry(self, rows: list[bytes], *, publishing_id: int, compression: str = "none") -> None:
            if sum(map(len, rows)) > 250:
                raise MessageTooLarge("does not fit the negotiated frame max")
            sent.append((publishing_id & 0xFFFFFFFF, len(rows)))

        async def flush(self) -> None: ...
        async def close(self) -> None: ...

    async def env_producer(stream: str, name: str) -> SmallFrames:
        return SmallFrames()

    writer = _TaskWriter(batch_id=1, sub_entry_size=10)
    env = SimpleNamespace(producer=env_producer)
    asyncio.run(writer.publish_runs(env, [("s", "app-0", [bytes(100)] * 10)]))
    asyncio.run(writer.finish(env))
    assert sent == [(1, 2), (2, 1), (4, 2), (6, 2), (7, 1), (9, 2)]  # halves, and halves again, under 250 bytes
    assert [pid for pid, _ in sent] == sorted(pid for pid, _ in sent)


def test_filter_values_go_one_entry_per_row_each_with_its_rows_text() -> None:
    import pyarrow as pa

    from smartclient.spark.sink import filter_value_of, filtered

    with pytest.raises(ConfigurationError, match="filter_column='region': a sub-entry's messages cannot carry"):
        ExactlyOnceSink(CONN, app_id="a", stream="s", partitioning="input", filter_column="region")
    sink = ExactlyOnceSink(CONN, app_id="a", stream="s", partitioning="input", filter_column="region",
                           sub_entry_size=1)
    assert sink.filter_column == "region"
    bodies = filtered(pa.array([b"a", b"b", b"c"]), pa.array([7, None, 9]))
    assert bodies == [b"a", b"b", b"c"] and [filter_value_of(body) for body in bodies] == ["7", None, "9"]


def test_filtered_messages_are_copies_each_with_its_own_rows_value() -> None:
    import pyarrow as pa

    from smartclient.spark.sink import filter_value_of, filtered
    from smartclient.stream.codec import amqp_message

    message = amqp_message(b"x", {})
    shared = filtered([message, message, bytearray(b"y")], pa.array(["eu", "us", None]))
    assert [filter_value_of(m) for m in shared] == ["eu", "us", None]  # one object given twice: each row's value
    assert not hasattr(message, "smartclient_filter") and shared[2] == b"y"  # the application's own left alone

    class Slotted:
        __slots__ = ()

    with pytest.raises(ConfigurationError, match="a message of type Slotted cannot carry a filter value"):
        filtered([Slotted()], pa.array(["eu"]))
    with pytest.raises(ConfigurationError, match="filter column 'region' .* does not read as text"):
        filtered([b"a"], pa.array([b"\xff"]), "region")


@pytest.mark.parametrize("frame_limit", [None, 700])
def test_a_column_goes_out_in_the_same_sub_entries_under_the_same_ids_as_the_list_of_its_bodies(
        frame_limit: int | None) -> None:
    """Held rows joined to the next batch, cuts anywhere, a group over the frame max split in halves: the column
    path sends byte for byte what the list path sends."""
    import asyncio
    import random

    import pyarrow as pa

    from smartclient import MessageTooLarge
    from smartclient.spark.records import binary_column
    from smartclient.spark.sink import _TaskWriter
    from smartclient.stream.publish_frames import sub_entry

    def sent(rows: list[bytes], cuts: list[int], column: bool) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []

        class Producer:
            encoding = "amqp"

            async def send_sub_entry(self, group: object, *, publishing_id: int, compression: str = "none") -> None:
                entry = sub_entry(group, compression, self.encoding)  # type: ignore[arg-type]
                if frame_limit is not None and len(entry) > frame_limit:
                    raise MessageTooLarge("over the frame max")
                out.append((publishing_id, entry))

            async def flush(self) -> None: ...
            async def close(self) -> None: ...

        async def producer(stream: str, options: object) -> Producer:
            return Producer()

        writer = _TaskWriter(batch_id=3, sub_entry_size=7)
        env = SimpleNamespace(producer=producer)
        start = 0
        for end in [*cuts, len(rows)]:
            part = rows[start:end]
            bodies = binary_column(pa.array([b"-", *part]).slice(1), "body") if column else part
            asyncio.run(writer.publish_runs(env, [("s", "p", bodies)]))
            start = end
        asyncio.run(writer.finish(env))
        return out

    rng = random.Random(frame_limit)
    for _ in range(40):
        rows = [bytes([65 + i % 26]) * rng.choice([0, 3, 90, 255, 256, 300]) for i in range(rng.randint(1, 60))]
        cuts = sorted(rng.sample(range(1, len(rows)), min(3, len(rows) - 1))) if len(rows) > 1 else []
        expected = sent(rows, cuts, column=False)
        assert sent(rows, cuts, column=True) == expected == sent(rows, [], column=True)
