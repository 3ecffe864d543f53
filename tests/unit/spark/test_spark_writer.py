"""The rabbitmq_stream format's writers, what needs no Spark task: options as strings, checked and named; the order
a partition is written in; a super stream's partition per row."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from smartclient import ConfigurationError, hash_partition
from smartclient.spark import RabbitStreamDataSource
from smartclient.spark.sink import SLOT_COLUMN
from smartclient.spark.writer import WRITE_OPTIONS, WriteSpec, _ordered, _with_slot

COLUMNS = ("id", "user", "body")
BASE = {"uri": "rabbitmq-stream://u:secret@lb:5552/", "stream": "orders"}


def parse(streaming: bool = False, columns: tuple[str, ...] = COLUMNS, **options: str) -> WriteSpec:
    return WriteSpec.parse({k.lower(): v for k, v in {**BASE, **options}.items()}, columns, streaming=streaming)


def test_the_defaults_and_every_option_read_from_strings() -> None:
    spec = parse()
    assert (spec.stream, spec.app_id, spec.batch_id, spec.body_column, spec.sub_entry_size, spec.compression,
            spec.order_columns, spec.keep_input_order) == ("orders", None, 0, "body", 100, "none", (), False)
    spec = parse(appId="app", batchId="7", subEntrySize="1", propertyColumns="user, id", orderColumns="id",
                 loadBalancer="lb:5552")
    assert (spec.app_id, spec.batch_id, spec.sub_entry_size, spec.property_columns, spec.order_columns) == (
        "app", 7, 1, ("user", "id"), ("id",))
    assert pickle.loads(pickle.dumps(spec)) == spec and "secret" not in repr(spec)  # it crosses to the tasks
    spec = parse(stream="", superStream="invoices", keyColumns="user", compression="GZIP", keepInputOrder="TRUE")
    assert (spec.super_stream, spec.key_columns, spec.compression, spec.keep_input_order) == (
        "invoices", ("user",), "gzip", True)
    assert "keepInputOrder" in WRITE_OPTIONS
    spec = parse(filterColumn="user")  # filter values: one entry per row unless told otherwise
    assert (spec.filter_column, spec.sub_entry_size, spec.sink("a").filter_column) == ("user", 1, "user")


@pytest.mark.parametrize("options, message", [
    ({"stream": ""}, r"needs option\('stream', ...\) or option\('superStream', ...\)"),
    ({"superStream": "s"}, r"needs option\('stream', ...\) or option\('superStream', ...\), not both"),
    ({"stream": "", "superStream": "s"}, "superStream needs keyColumns"),
    ({"keyColumns": "user"}, "keyColumns is a super stream's routing key"),
    ({"uri": ""}, r"needs option\('uri'"),
    ({"subEntrySize": "many"}, r"subEntrySize='many': a whole number is needed"),
    ({"subEntrySize": "0"}, r"subEntrySize='0': must be 1 to 65535"),
    ({"batchId": "-1"}, r"batchId='-1': must be 0 to 2147483647"),
    ({"compression": "zstd"}, r"compression='zstd': use none or gzip"),
    ({"compression": "gzip", "subEntrySize": "1"}, "subEntrySize must be above 1"),
    ({"keepInputOrder": "yes"}, r"keepInputOrder='yes': use 'true' or 'false'"),
    ({"filterColumn": "region"}, r"filterColumn: no column 'region'"),
    ({"filterColumn": "user", "subEntrySize": "100"}, "cannot carry a filter value each; leave subEntrySize out"),
    ({"filterColumn": "user", "compression": "gzip"}, "filterColumn and compression=gzip: filter values go one"),
    ({"keepInputOrder": "true", "orderColumns": "id"}, "keepInputOrder=true and orderColumns: give one"),
    ({"bodyColumn": "payload"}, r"bodyColumn: no column 'payload' in the rows \(columns: id, user, body\)"),
    ({"orderColumns": "id,when"}, r"orderColumns: no column 'when'"),
    ({"streams": "a,b"}, r"unknown option 'streams' \(known: uri, loadBalancer, stream,"),
])
def test_a_bad_option_is_a_typed_error_naming_it(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse(**options)


def test_a_streaming_query_numbers_its_own_batches_and_a_stream_is_never_overwritten() -> None:
    with pytest.raises(ConfigurationError, match="batchId is for batch writes"):
        parse(streaming=True, batchId="3")
    schema = pa.schema([("body", pa.binary())])
    source = RabbitStreamDataSource({k.lower(): v for k, v in BASE.items()})
    with pytest.raises(ConfigurationError, match=r"append-only; write with mode\('append'\)"):
        source.writer(_Schema(schema), True)
    with pytest.raises(ConfigurationError, match="append-only"):
        source.streamWriter(_Schema(schema), True)


class _Schema:
    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def fieldNames(self) -> list[str]:
        return list(self.schema.names)


def _batches() -> list[pa.RecordBatch]:
    return [pa.record_batch({"id": [3, 1], "user": ["b", "a"], "body": [b"3", b"1"]}),
            pa.record_batch({"id": [2, 1], "user": ["a", "a"], "body": [b"2", b"0"]})]


def test_a_partition_is_written_sorted_by_every_column_or_the_order_columns_or_as_it_came() -> None:
    def ids(spec: WriteSpec, batches: list[pa.RecordBatch]) -> list[tuple[int, bytes]]:
        rows = [row for batch in _ordered(spec, iter(batches)) for row in batch.to_pylist()]
        return [(row["id"], row["body"]) for row in rows]

    everything = [(1, b"0"), (1, b"1"), (2, b"2"), (3, b"3")]
    assert ids(parse(), _batches()) == everything
    assert ids(parse(), _batches()[::-1]) == everything  # however the rows arrive: the same sequence
    assert ids(parse(orderColumns="user,body"), _batches()) == [(1, b"0"), (1, b"1"), (2, b"2"), (3, b"3")]
    assert ids(parse(keepInputOrder="true"), _batches()) == [(3, b"3"), (1, b"1"), (2, b"2"), (1, b"0")]
    assert ids(parse(), []) == []


def test_a_partition_in_order_already_is_not_sorted_and_ties_on_the_first_column_are_sorted_by_the_rest() -> None:
    import pyarrow as pa

    from smartclient.spark.writer import _increasing

    def bodies(*batches: dict[str, list[object]]) -> list[object]:
        ordered = _ordered(parse(), iter(pa.record_batch(batch) for batch in batches))
        return [row["body"] for batch in ordered for row in batch.to_pylist()]

    # the first column strictly increasing: already in the order every column gives, so no sort
    assert _increasing(pa.chunked_array([[1, 2], [5]]))
    assert bodies({"id": [1, 2], "body": [b"b", b"a"]}, {"id": [5], "body": [b"c"]}) == [b"b", b"a", b"c"]
    assert not _increasing(pa.chunked_array([[1, 1, 0]]))  # ties: the rest of the columns decide
    assert bodies({"id": [1, 1, 0], "body": [b"b", b"a", b"c"]}) == [b"c", b"a", b"b"]
    assert not _increasing(pa.chunked_array([[None, 1]]))  # a null: sorted (nulls last)
    assert bodies({"id": [None, 1], "body": [b"b", b"a"]}) == [b"a", b"b"]
    assert not _increasing(pa.chunked_array([[[2], [1]]]))  # a type Arrow does not compare: sorted by sort_by
    assert _increasing(pa.chunked_array([[7]])) and not _increasing(pa.chunked_array([[None]]))


def test_a_super_stream_row_goes_where_the_other_clients_route_its_key() -> None:
    spec = parse(stream="", superStream="invoices", keyColumns="user,id")
    partitions = ["invoices-0", "invoices-1", "invoices-2"]
    batch = _with_slot(spec, _batches()[0], len(partitions))
    assert batch.column_names[-1] == SLOT_COLUMN
    assert [partitions[s] for s in batch.column(SLOT_COLUMN).to_pylist()] == [
        hash_partition("b|3", partitions), hash_partition("a|1", partitions)]


def test_register_format_registers_on_a_classic_session_without_a_probe() -> None:
    from smartclient.spark import register_format
    from smartclient.spark._pyspark import is_connect_session

    registered: list[object] = []

    class DataSources:
        def register(self, source: object) -> None:
            registered.append(source)

    class Classic:  # a classic session: no job is run, the class is registered
        dataSource = DataSources()

        def range(self, *args: object) -> object:
            raise AssertionError("no probe on a classic session")

    class Connect:
        pass

    Connect.__module__ = "pyspark.sql.connect.session"
    register_format(Classic())
    assert registered == [RabbitStreamDataSource]
    assert not is_connect_session(Classic()) and is_connect_session(Connect())
    with pytest.raises(ConfigurationError, match=r"register_format needs a SparkSession \(its dataSource.register\), "
                                                 r"not dict"):
        register_format({})
