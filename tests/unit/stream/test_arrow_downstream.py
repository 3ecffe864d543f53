"""A chunk's columns handed to pandas, Polars and DuckDB, as docs/arrow.md shows (each where it is installed:
the dev install has all three).  No broker: the batch is built from a Deliver frame made here."""

from __future__ import annotations

from typing import Any

import pytest

pa = pytest.importorskip("pyarrow", minversion="19")

from smartclient.core.amqp_data import data_section  # noqa: E402
from smartclient.stream._rstream.columns import chunk_batch  # noqa: E402
from tests.unit.fakes import delivered  # noqa: E402

BODIES = [b"%d:a body longer than twelve bytes" % i if i % 2 else b"%d:short" % i for i in range(100)]


@pytest.fixture
def table() -> Any:
    return pa.Table.from_batches([chunk_batch(delivered([data_section(b) for b in BODIES], first=1000), 1000)])


def test_pandas(table: Any) -> None:
    pd = pytest.importorskip("pandas")
    df = table.to_pandas()  # bodies as bytes objects (copied)
    assert df["body"].tolist() == BODIES and df["offset"].tolist() == list(range(1000, 1100))
    assert str(df["timestamp"].dtype) == "datetime64[ms, UTC]"
    kept = table.to_pandas(types_mapper=pd.ArrowDtype)  # still binary_view, over the frame
    assert str(kept["body"].dtype) == "binary_view[pyarrow]" and kept["body"].iloc[3] == BODIES[3]


def test_polars(table: Any) -> None:
    pl = pytest.importorskip("polars")
    df = pl.from_arrow(table)
    assert df["body"].to_list() == BODIES and df["offset"].to_list() == list(range(1000, 1100))
    assert df.filter(pl.col("body").bin.ends_with(b"short")).height == 50


def test_duckdb(table: Any) -> None:
    chunks = table  # noqa: F841  (duckdb finds a local Arrow table by its name; "table" is a keyword)
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql('select count(*), min("offset"), max("offset"), max(octet_length(body)) from chunks').fetchall()
    assert rows == [(100, 1000, 1099, max(len(b) for b in BODIES))]
    assert duckdb.sql('select body from chunks where "offset" = 1003').fetchall() == [(BODIES[3],)]
