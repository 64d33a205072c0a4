"""A typed read across ALTER TABLE: schema versions, the three schemaEvolution modes, and
the union of a table's maps (relay/tap/evolution.py)."""

from __future__ import annotations

import importlib
import os
from decimal import Decimal

import pytest

# pyarrow is a dev dependency (scripts/setup installs it): under CI its absence fails the
# module instead of skipping it.
if os.environ.get("CI"):
    importlib.import_module("pyarrow")
else:
    pytest.importorskip("pyarrow")

from relay.binlog.describe import ColumnDescription, table_map
from relay.binlog.tablemap import TableMap
from relay.tap.arrow import BatchBuilder, arrow_schema
from relay.tap.evolution import (
    RESCUED,
    SchemaChanged,
    SchemaEvolution,
    ShapeCheck,
    schema_version,
    union,
)
from relay.tap.sparktypes import spark_type


def col(name: str, data_type: str, column_type: str | None = None,
        octets: int | None = None, collation: int | None = None) -> ColumnDescription:
    return ColumnDescription(name, data_type, column_type or data_type, True, None, None,
                             None, octets, collation)


def version(*columns: ColumnDescription) -> TableMap:
    return table_map("shop", "orders", [col("id", "int"), *columns], ["id"])


V1 = version(col("qty", "int"), col("note", "varchar", "varchar(10)", 10, 45))
LONGER = version(col("qty", "int"), col("note", "varchar", "varchar(20)", 20, 45))
ADDED = version(col("qty", "int"), col("note", "varchar", "varchar(10)", 10, 45),
                col("price", "decimal", "decimal(10,2)"))
DROPPED = version(col("note", "varchar", "varchar(10)", 10, 45))
RETYPED = version(col("qty", "bigint"), col("note", "varchar", "varchar(10)", 10, 45))


def test_versions_tell_tables_apart_by_their_columns() -> None:
    assert schema_version(V1) == schema_version(version(
        col("qty", "int"), col("note", "varchar", "varchar(10)", 10, 45)))
    assert len({schema_version(t) for t in (V1, LONGER, ADDED, DROPPED, RETYPED)}) == 5


def test_fail_stops_at_a_change_a_spark_column_shows_and_says_how_to_read_on() -> None:
    check = ShapeCheck(V1, SchemaEvolution.FAIL, spark_type)
    assert check.shape(V1, "here").version == check.version
    longer = check.shape(LONGER, "here")  # VARCHAR(10) -> VARCHAR(20): still a STRING
    assert longer.version != check.version and not longer.rescued
    for changed, words in ((ADDED, "new columns price"), (DROPPED, "columns gone qty"),
                           (RETYPED, "qty INT -> BIGINT")):
        with pytest.raises(SchemaChanged, match=words) as err:
            check.shape(changed, "at position 42")
        assert "at position 42" in str(err.value) and "add_columns" in str(err.value)


def test_add_columns_takes_rows_without_a_column_and_asks_for_a_restart_for_new_ones() -> None:
    check = ShapeCheck(ADDED, SchemaEvolution.ADD_COLUMNS, spark_type)
    assert check.shape(V1, "here").version == schema_version(V1)  # price is NULL there
    assert check.shape(DROPPED, "here").version == schema_version(DROPPED)
    with pytest.raises(SchemaChanged, match="restart the query"):
        ShapeCheck(V1, SchemaEvolution.ADD_COLUMNS, spark_type).shape(ADDED, "here")
    with pytest.raises(SchemaChanged, match="does not change a column's type"):
        check.shape(RETYPED, "here")


def test_json_keeps_what_does_not_fit_in_rescued() -> None:
    check = ShapeCheck(V1, SchemaEvolution.JSON, spark_type)
    assert check.shape(ADDED, "here").rescued == {"price"}
    assert check.shape(RETYPED, "here").rescued == {"qty"}
    assert check.shape(DROPPED, "here").rescued == frozenset()
    builder = BatchBuilder("typed", V1, evolution=SchemaEvolution.JSON)
    values = builder.typed_values({"id": 1, "qty": 2**40, "note": "x"}, frozenset({"qty"}))
    assert values == {"id": 1, "qty": None, "note": "x", RESCUED: '{"qty":1099511627776}'}
    assert builder.typed_values({"id": 1, "note": "y"})[RESCUED] is None
    assert arrow_schema("typed", V1, SchemaEvolution.JSON).field("after").type \
        .get_field_index(RESCUED) == 3


def test_the_union_keeps_dropped_columns_after_the_newest_ones() -> None:
    merged = union([V1, ADDED, DROPPED])
    assert merged.names == ("id", "note", "qty", "price")
    assert [c.index for c in merged.columns] == [0, 1, 2, 3]
    assert union([V1]) is V1
    check = ShapeCheck(merged, SchemaEvolution.ADD_COLUMNS, spark_type)
    for table in (V1, ADDED, DROPPED):  # every version the union came from fits
        assert check.shape(table, "here").version == schema_version(table)


def test_a_snapshot_is_judged_by_the_table_it_read_as_a_change_is() -> None:
    """A chunk's rows go through the query's check with the table's map as the chunk read
    it: columns the schema lacks stop fail and add_columns, json rescues them; a dropped
    column stops fail; the rows carry the version they were read under."""
    rows = [(1, 2, "n", Decimal("1.50"))]
    names = ["id", "qty", "note", "price"]
    for mode in (SchemaEvolution.FAIL, SchemaEvolution.ADD_COLUMNS):
        check = BatchBuilder("typed", V1, evolution=mode).check
        assert check is not None
        with pytest.raises(SchemaChanged, match="price"):
            check.shape(ADDED, "where the snapshot read it")
    with pytest.raises(SchemaChanged, match="columns gone qty"):
        ShapeCheck(V1, SchemaEvolution.FAIL, spark_type).shape(DROPPED, "there")
    builder = BatchBuilder("typed", V1, evolution=SchemaEvolution.JSON)
    assert builder.check is not None
    shape = builder.check.shape(ADDED, "where the snapshot read it")
    with pytest.raises(ValueError, match="needs the shape"):
        list(builder.add_snapshot_rows("shop", "orders", names, rows, 7, 0))
    assert list(builder.add_snapshot_rows("shop", "orders", names, rows, 7, 0,
                                          shape=shape)) == []
    batch = builder.flush()
    after = batch.column("after").to_pylist()[0]
    assert after == {"id": 1, "qty": 2, "note": "n", RESCUED: '{"price":"1.50"}'}
    assert batch.column("schema_version").to_pylist() == [schema_version(ADDED)]
