"""The one definition of "the dirty keys of a table and their images in one snapshot"
(`hot_reader.dirty_images_query`), as the export and a report's read build it (no server)."""

from coldharbor.capture.registry import LakeColumn, RegisteredTable
from coldharbor.export.hot_reader import dirty_images_query
from coldharbor.serve import hot_snapshot


def test_dirty_images_query_quotes_identifiers_and_reads_keys_from_the_change_log():
    table = RegisteredTable(7, "Sales", 'odd"name', ("id",), None, (), ())
    columns = [LakeColumn("id", "bigint", "LONG", 1), LakeColumn("u", "uuid", "STRING", None)]
    text = dirty_images_query(table, columns).as_string(None)
    assert '"Sales"."odd""name"' in text
    assert "(c.key ->> 'id')::bigint AS \"_ch_k0\"" in text and 'd."_ch_k0" AS "id"' in text
    assert '(t."u")::text AS "u"' in text
    assert "flushed_at IS NULL" in text and "table_id = 7" in text
    assert "jsonb_hash" not in text, "one reader reads every dirty key"
    share = dirty_images_query(table, columns, part=1, parts=2).as_string(None)
    assert "(jsonb_hash(c.key) & 2147483647) % 2 = 1" in share


def test_a_report_reads_the_export_s_dirty_set_widened_to_its_pinned_version():
    table = RegisteredTable(7, "Sales", "orders", ("id", "region"), None, (), ())
    columns = [LakeColumn("id", "bigint", "LONG", 1), LakeColumn("region", "text", "STRING", 2),
               LakeColumn("note", "text", "STRING", None)]
    report = hot_snapshot.dirty_images_query(table, columns, 5).as_string(None)
    export = dirty_images_query(table, columns).as_string(None)
    for text in (report, export):  # the same keys, typed, and the same join to their rows
        assert "(c.key ->> 'id')::bigint AS \"_ch_k0\", (c.key ->> 'region')::text AS \"_ch_k1\"" in text
        assert "GROUP BY 1, 2" in text
        assert 'LEFT JOIN "Sales"."orders" t ON t."id" = d."_ch_k0" AND t."region" = d."_ch_k1"' in text
        assert 't."id" IS NULL AS "_ch_deleted"' in text
    # the report's: unflushed changes and those flushed after version 5, each arm on its own index
    assert "flushed_at IS NULL" in report and "lake_version > 5" in report and "UNION ALL" in report
    assert " OR " not in report
    assert "change_seq" not in report and "change_seq" in export  # a report needs the images alone
    assert "lake_version" not in export
