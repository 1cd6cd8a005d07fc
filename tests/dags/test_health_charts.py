"""The health page's charts and lineage's dataset names, from figures made up here (no server)."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def sample(minutes_ago: float, lag: float) -> dict:
    return {"sampled_at": NOW - timedelta(minutes=minutes_ago), "lag_s": lag, "export_status": "exported"}


def points(svg: str) -> list[tuple[float, float]]:
    [line] = re.findall(r'points="([^"]*)"', svg)
    return [tuple(map(float, p.split(","))) for p in line.split()]


def test_samples_far_apart_fall_to_zero_between_and_odd_values_stay_on_the_chart(airflow_home):
    from coldharbor_airflow import health_charts as charts

    svg = charts.sparkline([sample(20 * 60, 40), sample(60, 40), sample(59, float("nan")), sample(58, -5),
                            sample(57, float("inf")), sample(-180, 99)], "lag_s", NOW, "lag")
    ys = [y for _, y in points(svg)]
    assert len(ys) == 7 and ys[1] == ys[2] == charts.HEIGHT - 2, ys   # two zero points in the 19-hour gap
    assert all(0 <= y <= charts.HEIGHT and 0 <= x <= charts.WIDTH for x, y in points(svg))
    assert "nan" not in svg and "inf" not in svg
    assert "latest 0.0 s, highest 40 s" in svg                     # the future sample is not drawn


def test_one_sample_is_a_dot_and_no_sample_is_said(airflow_home):
    from coldharbor_airflow import health_charts as charts

    assert "<circle" in charts.sparkline([sample(1, 3)], "lag_s", NOW, "lag")
    empty = charts.sparkline([], "lag_s", NOW, "lag")
    assert "no sample" in empty and "<polyline" not in empty


def test_lake_datasets_keep_whole_paths_and_local_ones_are_absolute(airflow_home, monkeypatch, tmp_path):
    from coldharbor_airflow.lineage import lake_dataset

    assert [(d.namespace, d.name) for d in map(lake_dataset, ["s3a://lake/ev#v2?x=1", "s3a://lake/ev?v3",
                                                              "s3://lake/a/b", "file:///data/x#1"])] == [
        ("s3://lake", "ev#v2?x=1"), ("s3://lake", "ev?v3"), ("s3://lake", "a/b"), ("file", "/data/x#1")]
    monkeypatch.chdir(tmp_path)
    assert lake_dataset("lake/public/t").name == f"{tmp_path}/lake/public/t"
