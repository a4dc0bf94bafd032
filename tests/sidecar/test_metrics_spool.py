"""sidecar.metrics_spool.MetricsSpool: with several worker processes, /metrics serves every live worker's series."""

from __future__ import annotations

import os
import time

from prometheus_client import CollectorRegistry, Counter

from api.metrics import Metrics
from sidecar.metrics_spool import SPOOL_STALE_S, MetricsSpool


def test_a_scrape_serves_every_live_workers_series_labelled_with_its_worker(tmp_path):
    metrics = Metrics(spool_dir=tmp_path)
    metrics.cache_lookup("local", "hit")
    other = CollectorRegistry()
    Counter("esun_cache_lookups", "Lookups.", ["level", "result"], registry=other).labels("local", "hit").inc(3)
    MetricsSpool(tmp_path, other).write()  # as another worker would: a file named by its process id
    (tmp_path / f"{os.getpid()}.prom").rename(tmp_path / "4242.prom")
    text = metrics.render().decode()
    me = os.getpid()
    assert f'esun_cache_lookups_total{{level="local",result="hit",worker="{me}"}} 1.0' in text
    assert 'esun_cache_lookups_total{level="local",result="hit",worker="4242"} 3.0' in text
    assert text.count("# TYPE esun_cache_lookups_total counter") == 1  # one family, both workers' samples
    metrics.close()
    assert not (tmp_path / f"{me}.prom").exists()


def test_a_dead_workers_file_is_left_out_and_removed(tmp_path):
    metrics = Metrics(spool_dir=tmp_path)
    dead = tmp_path / "999999.prom"
    dead.write_text('# TYPE esun_x gauge\nesun_x 1.0\n')
    old = time.time() - SPOOL_STALE_S - 1
    os.utime(dead, (old, old))
    assert 'worker="999999"' not in metrics.render().decode()
    assert not dead.exists()
    metrics.close()


def test_without_a_shared_folder_the_series_have_no_worker_label():
    assert b"worker=" not in Metrics().render()
