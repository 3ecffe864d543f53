"""smartclient.spark.records: a column of bodies grouped and encoded as the list path groups and encodes it."""

from __future__ import annotations

import random

import pytest

pa = pytest.importorskip("pyarrow", reason="the column path needs pyarrow (the [spark] extra)")
pytest.importorskip("numpy", reason="the column path needs numpy (the [spark] extra)")

from smartclient import ConfigurationError  # noqa: E402
from smartclient.spark import sink as sink_module  # noqa: E402
from smartclient.spark.records import binary_column, closed_ends, encode, lengths  # noqa: E402
from smartclient.stream.publish_frames import Records, sub_entry  # noqa: E402

SIZES = {
    "one size": lambda rng, n: [rng.choice([0, 1, 100, 255, 256, 3000])] * n,
    "short": lambda rng, n: [rng.randint(0, 255) for _ in range(n)],
    "long": lambda rng, n: [rng.randint(256, 2000) for _ in range(n)],
    "mixed": lambda rng, n: [rng.choice([rng.randint(0, 255), rng.randint(256, 5000)]) for _ in range(n)],
}


@pytest.mark.parametrize("kind", sorted(SIZES))
def test_a_column_is_grouped_and_encoded_byte_for_byte_as_the_list_of_its_bodies(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(kind)
    for _ in range(300):
        count = rng.randint(0, 40)
        bodies = [bytes([rng.randint(0, 255)]) * size for size in SIZES[kind](rng, count)]
        most, limit = rng.randint(1, 10), rng.choice([10, 300, 2000, 1 << 19])
        array = pa.array([b"-", *bodies], rng.choice([pa.binary(), pa.large_binary(), pa.string()])
                         if all(b.isascii() for b in bodies) else pa.binary()).slice(1)  # an offset, as a slice has
        column = binary_column(array, "body")
        monkeypatch.setattr(sink_module, "SUB_ENTRY_BYTES", limit)
        expected = sink_module.closed_groups(list(map(len, bodies)), most)
        assert closed_ends(lengths(column), most, limit) == expected
        for encoding in ("amqp", "raw"):
            data, starts = encode(column, encoding == "amqp")
            first = 0
            for end in [*expected, count] if count else []:
                if end > first:
                    records = Records(data[starts[first]:starts[end]], end - first, encoding == "amqp")
                    assert sub_entry(records, "none", encoding) == sub_entry(bodies[first:end], "none", encoding)
                first = end


def test_a_null_body_or_a_column_not_of_bytes_is_refused_naming_the_column() -> None:
    with pytest.raises(ConfigurationError, match="null body column 'payload'"):
        binary_column(pa.array([b"x", None]), "payload")
    with pytest.raises(ConfigurationError, match="'payload' is int64: it must hold bytes or text"):
        binary_column(pa.array([1, 2]), "payload")


def test_records_for_the_other_encoding_are_refused() -> None:
    data, starts = encode(binary_column(pa.array([b"ab"]), "body"), amqp=False)
    with pytest.raises(ConfigurationError, match="without AMQP data sections for a producer whose encoding is 'amqp'"):
        sub_entry(Records(data, 1, False), "none", "amqp")


def test_records_of_a_view_with_wide_items_count_its_bytes() -> None:
    import numpy as np

    wide = memoryview(np.array([1, 2], np.int32))
    assert sub_entry(Records(wide, 1, False), "none", "raw") == sub_entry(Records(wide.tobytes(), 1, False), "none",
                                                                        "raw")


def test_view_and_fixed_size_columns_are_taken_as_bytes() -> None:
    for column in (pa.array([b"ab"], pa.binary_view()), pa.array(["ab"], pa.string_view()), pa.array([b"ab"],
                                                                                                    pa.binary(2))):
        assert binary_column(column, "body").to_pylist() == [b"ab"]
